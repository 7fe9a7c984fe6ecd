"""Train the facet tagger shipped as esqbe/tagger/data/tagger-minilm-l6.pt (seeded; epochs picked on dev).

    HF_HUB_OFFLINE=1 python scripts/train_tagger.py --data /path/to/csabstruct

Until `esqbe train-tagger` exists this is the reproducible command; both call `train_tagger`.
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from esqbe.tagger.train import EPOCHS, train_tagger  # noqa: E402
from esqbe.tagger.weights import DEFAULT_WEIGHTS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, type=Path, help="directory with CSAbstruct train.jsonl and dev.jsonl")
    ap.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--model", default=None, help="encoder (default: the esqbe default model)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    args = ap.parse_args()

    from esqbe.encode.encoder import Encoder

    metrics = train_tagger(args.data / "train.jsonl", args.data / "dev.jsonl", args.out,
                           encoder=Encoder.load(args.model, backend="torch"), seed=args.seed, epochs=args.epochs)
    print(json.dumps(metrics, indent=1))


if __name__ == "__main__":
    main()
