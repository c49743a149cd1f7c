"""Build the accuracy corpus offline from the two Debian packages (or the files inside them).

    apt-get download r-cran-janeaustenr bible-kjv-text
    python3 build_scripts/build_corpus.py --austen r-cran-janeaustenr_*.deb --kjv bible-kjv-text_*.deb -o corpus

Writes corpus/train.txt, corpus/heldout/{persuasion,northanger_abbey}.txt and corpus/manifest.json
(trtllm_replayssm/lab/corpus, standard library only).
"""
from __future__ import annotations

import argparse
import json
import sys

from trtllm_replayssm.lab.corpus import build_corpus


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--austen", required=True, help="r-cran-janeaustenr .deb or its data/Rdata.rdb")
    parser.add_argument("--kjv", required=True, help="bible-kjv-text .deb or its /usr/lib/bible.data")
    parser.add_argument("-o", "--out-dir", default="corpus")
    args = parser.parse_args(argv)
    try:
        manifest = build_corpus(args.austen, args.kjv, args.out_dir)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
