"""Is reading hostile input linear? Times the readers on the inputs issue 40 found quadratic or unbounded, at a
size n and at 2n, same run, and prints the ratio (about 2 when linear, about 4 when quadratic).

    .venv/bin/python benchmarks/bench_readers.py [--scale 1] [--repeat 3]

Cases: CSL-JSON items (line numbers were counted from the file's start for every item), BibTeX entries reusing
one @string (each use was decoded again), a BibTeX abstract (LaTeX was decoded before any bound), an OpenAlex
inverted index (rebuilt before any bound), JSON Lines records. Reads in-process (esqbe.ingest.readers), no model.
"""
import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from esqbe.ingest.readers import ReadReport, read_papers  # noqa: E402


def csl(n: int) -> tuple[str, str]:
    items = [json.dumps({"id": f"i{i}", "title": "A title", "abstract": "We parse graphs. It is fast."})
             for i in range(n)]
    return "csl-json", "[\n" + ",\n".join(items) + "\n]\n"


def bibtex_strings(n: int) -> tuple[str, str]:
    text = '@string{s = "' + "Word {\\'e}t{\\'e}. " * 5_500 + '"}\n'
    return "bibtex", text + "".join(f"@article{{e{i}, title = {{Entry {i}}}, abstract = s}}\n" for i in range(n))


def bibtex_abstract(n: int) -> tuple[str, str]:
    return "bibtex", "@article{k, title = {T}, abstract = {" + "word. " * n + "}}\n"


def openalex(n: int) -> tuple[str, str]:
    return "openalex", json.dumps({"id": "https://openalex.org/W1", "abstract_inverted_index": {"w" * 1000: list(range(n))}})


def jsonl(n: int) -> tuple[str, str]:
    return "jsonl", "".join(json.dumps({"id": f"p{i}", "abstract": "We parse graphs. It is fast."}) + "\n" for i in range(n))


CASES = {"csl-json items": (csl, 20_000), "bibtex @string uses": (bibtex_strings, 200),
         "bibtex abstract words": (bibtex_abstract, 500_000), "openalex positions": (openalex, 200_000),
         "jsonl records": (jsonl, 20_000)}


def seconds(fmt: str, text: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _paper in read_papers(io.StringIO(text), fmt, report=ReadReport()):
            pass
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies each case's n")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'case':24} {'n':>9} {'MB':>7} {'s(n)':>8} {'s(2n)':>8} {'ratio':>6}")
    for name, (make, n) in CASES.items():
        n = max(1, int(n * args.scale))
        fmt, text = make(n)
        one = seconds(fmt, text, args.repeat)
        two = seconds(*make(2 * n), args.repeat)
        print(f"{name:24} {n:>9} {len(text) / 1e6:>7.2f} {one:>8.3f} {two:>8.3f} {two / max(one, 1e-9):>6.2f}")


if __name__ == "__main__":
    main()
