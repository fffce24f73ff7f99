"""How often the stop-word test tells a page's language without lingua, how often
wrongly, and what each costs (``trove_fetcher.language``: ``by_stop_words``).

Needs a corpus of sentences, one file per language named by its ISO 639-1 code
(``en.txt``, one sentence a line), such as lingua's own test sentences::

    git clone https://github.com/pemistahl/lingua-rs
    mkdir corpus && for d in lingua-rs/language-models/*/; do
        cp "$d/testdata/sentences.txt" "corpus/$(basename "$d").txt"; done
    .venv/bin/python bench/bench_language.py corpus

Sentences are joined into samples of ``SAMPLE_CHARS`` (what the detector reads of a
page). It prints:

* **told**: for each language the test may tell, the share of its samples it tells
  (those the detector is spared);
* **false**: samples told as another language, by pair, with what the detector says
  of them (when it says the same, the test changed nothing);
* **CPU**: the test against the detector on the same samples, µs a sample, side by
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
    told_by = sorted(identifier.told_by_stop_words)
    told: Counter[str] = Counter()
    false: Counter[tuple[str, str, str]] = Counter()
    for language, texts in corpus.items():
        for text in texts:
            said = identifier.by_stop_words(text)
            if said is None:
                continue
            if said == language:
                told[said] += 1
            else:
                detector = identifier.detect_text(text) or "unsure"
                false[(said, language, detector)] += 1
    known = sorted(identifier.languages)
    print(
        f"{sum(map(len, corpus.values()))} samples of {args.chars} characters, "
        f"{len(corpus)} languages; detector: {len(known)} languages"
    )
    print("told by the stop-word test:")
    for language in told_by:
        n = len(corpus.get(language, []))
        share = told[language] / n if n else float("nan")
        print(f"  {language}  {share:.2f}  ({told[language]} of {n})")
    print("told wrongly (told, language, what the detector says):")
    for (said, language, detector), n in false.most_common():
        known_to_detector = "known" if language in identifier.languages else "not known"
        total = len(corpus[language])
        print(
            f"  {said} <- {language} ({known_to_detector} to the detector): {n} of {total}; "
            f"detector: {detector}"
        )
    if not false:
        print("  none")
    texts = [text for language in told_by for text in corpus.get(language, [])]
    identifier.detect_text(texts[0])  # build the detector outside the timing
    test: list[float] = []
    detect: list[float] = []
    for _ in range(args.rounds):
        start = time.process_time()
        for text in texts:
            identifier.by_stop_words(text)
        test.append((time.process_time() - start) / len(texts) * 1e6)
        start = time.process_time()
        for text in texts:
            identifier.detect_text(text)
        detect.append((time.process_time() - start) / len(texts) * 1e6)
    c, d = statistics.median(test), statistics.median(detect)
    print(
        f"CPU a sample (medians of {args.rounds}): the test {c:.0f} µs, "
        f"detector {d:.0f} µs (warm): x{d / c:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
