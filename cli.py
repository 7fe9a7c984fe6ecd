"""The `esqbe` console script and `python -m cli`: the command line lives in `esqbe.cli`."""
from esqbe.cli.main import main

if __name__ == "__main__":
    main()
