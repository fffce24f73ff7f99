"""How often a page's ``<html lang>`` is borne out without lingua, how often wrongly, and
what each costs (``trove_fetcher.language``: ``LanguageIdentifier.confirms``).

Needs a corpus of sentences, one file per language named by its ISO 639-1 code
(``en.txt``, one sentence a line), such as lingua's own test sentences::

    git clone https://github.com/pemistahl/lingua-rs
    mkdir corpus && for d in lingua-rs/language-models/*/; do
        cp "$d/testdata/sentences.txt" "corpus/$(basename "$d").txt"; done
    .venv/bin/python bench/bench_language.py corpus

Sentences are joined into samples of ``SAMPLE_CHARS`` (what the detector reads of a
page). For every sample and every hint the identifier may confirm, it prints:

* **borne out**: the share of samples of a language confirmed under their own hint
  (those the detector is spared);
* **false**: samples of another language confirmed under a hint, by pair, with what the
  detector says of them (when it says the hinted language too, confirming it changed
  nothing);
* **CPU**: ``confirms`` against the detector on the same samples, µs a sample, side by
  side in one run (the detector's models warm; on a crawl they are often cold).

Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "services" / "fetcher"), str(ROOT / "libs" / "schema")]

from trove_fetcher.language import SAMPLE_CHARS, LanguageIdentifier  # noqa: E402


def samples(path: Path, chars: int) -> list[str]:
    out: list[str] = []
    current = ""
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        current = f"{current} {line.strip()}".strip()
        if len(current) >= chars:
            out.append(current[:chars])
            current = ""
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="folder of <iso-639-1>.txt files")
    parser.add_argument("--chars", type=int, default=SAMPLE_CHARS)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the CPU timing")
    args = parser.parse_args()
    identifier = LanguageIdentifier()
    corpus = {
        path.stem: samples(path, args.chars)
        for path in sorted(args.corpus.glob("*.txt"))
        if len(path.stem) == 2
    }
    hints = sorted(identifier.confirmable)
    borne: Counter[str] = Counter()
    false: Counter[tuple[str, str, str]] = Counter()
    for language, texts in corpus.items():
        for text in texts:
            for hint in hints:
                if not identifier.confirms(hint, text):
                    continue
                if hint == language:
                    borne[hint] += 1
                else:
                    said = identifier.detect_text(text) or "unsure"
                    false[(hint, language, said)] += 1
    known = sorted(identifier.languages)
    print(
        f"{sum(map(len, corpus.values()))} samples of {args.chars} characters, "
        f"{len(corpus)} languages; detector: {len(known)} languages"
    )
    print("borne out under their own hint:")
    for hint in hints:
        n = len(corpus.get(hint, []))
        print(f"  {hint}  {borne[hint] / n if n else float('nan'):.2f}  ({borne[hint]} of {n})")
    print("false confirmations (hint, language, what the detector says):")
    for (hint, language, said), n in false.most_common():
        known_to_detector = "known" if language in identifier.languages else "not known"
        total = len(corpus[language])
        print(
            f"  {hint} <- {language} ({known_to_detector} to the detector): {n} of {total}; "
            f"detector: {said}"
        )
    if not false:
        print("  none")
    pairs = [(language, text) for language in hints for text in corpus.get(language, [])]
    identifier.detect_text(pairs[0][1])  # build the detector outside the timing
    confirm: list[float] = []
    detect: list[float] = []
    for _ in range(args.rounds):
        start = time.process_time()
        for language, text in pairs:
            identifier.confirms(language, text)
        confirm.append((time.process_time() - start) / len(pairs) * 1e6)
        start = time.process_time()
        for _language, text in pairs:
            identifier.detect_text(text)
        detect.append((time.process_time() - start) / len(pairs) * 1e6)
    c, d = statistics.median(confirm), statistics.median(detect)
    print(
        f"CPU a sample (medians of {args.rounds}): confirms {c:.0f} µs, "
        f"detector {d:.0f} µs (warm): x{d / c:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
