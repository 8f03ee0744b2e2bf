"""Keyword search in every script (issue 46, item 4): phrases found by bm25 and hybrid, per store.

    python bench/cjk_keyword.py                              # every store, this checkout's code
    python bench/cjk_keyword.py --code f903d26               # the code before issue 46 item 4 too, in one run
    python bench/cjk_keyword.py --stores milvus-lite,lancedb --samples

Seven short files (two Chinese, two Japanese, two Korean, one English) go through `ingest run` (the CLI, the
default model and backend) into a fresh collection of each store (bench/stores.py starts PostgreSQL and the
Milvus server); then 12 phrases, 4 Chinese, 4 Japanese and 4 Korean, of 2-4 characters from inside a longer
run of their script, typed as a user types them (no spaces), then 3 of 6 characters (one a script) and 2
English ones, are searched by bm25 and by hybrid through `ingest.search.Searcher` (what `ingest search`
calls), k = 5. A phrase is found when the top hit is its file. Printed per store and code: found / asked, per
mode; the phrases missed. tests/test_cjk_keyword.py searches the same files.

--samples: the bundled samples instead (samples/, every format; .doc and .ppt need LibreOffice) and the
phrase samples/README.md names for each file (9 Latin, 1 Chinese); found when its file is the first hit that
is not the README (which holds every phrase).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

CORPUS = {
    "zh_climate.txt": "全球气候变化正在影响农业生产。科学家们发现，极端天气事件越来越频繁，粮食产量因此下降。"
                      "城市化的高速发展也加剧了排放，各国政府需要制定新的政策来应对这一挑战。",
    "zh_rail.txt": "中国的高速铁路网络是世界上最大的。从北京到上海乘坐高铁只需要四个多小时，大大方便了人们的出行。"
                   "铁路建设需要大量钢铁，带动了钢铁产量和沿线城市的经济发展，天气好的时候乘客更多。",
    "ja_sakura.txt": "日本の春は桜の季節です。毎年三月から四月にかけて、多くの人々が公園に集まり、花見を楽しみます。"
                     "桜の開花予想は天気予報でも毎日伝えられ、東京の人々も心待ちにしています。",
    "ja_sushi.txt": "寿司職人になるためには長い修行が必要で、その修行は予想以上に厳しいものです。米の炊き方や魚のさばき方を"
                    "何年もかけて学びます。東京の老舗では伝統的な技術が受け継がれています。",
    "ko_kimchi.txt": "김치는 한국의 전통 음식으로 배추와 고춧가루로 만듭니다. 겨울이 오기 전에 가족들이 모여 김장을 하는 "
                     "문화가 있습니다.",
    "ko_subway.txt": "서울의 지하철은 매우 편리하고 깨끗합니다. 출퇴근 시간에는 사람들이 많아서 혼잡하지만 "
                     "대중교통요금은 저렴한 편입니다. 역 앞 빵집에서는 밀가루 냄새가 납니다.",
    "en_lighthouse.txt": "The lighthouse keeper climbs the spiral stairs every evening to light the lamp, and logs "
                         "passing ships in a leather-bound journal.",
}
# (phrase, its file): 2-4 characters from inside a longer run of their script; the files of a script share
# some of the longer phrases' bigrams (产量, 高速, 予想, 가루, 天气, 東京), so one bigram does not decide
PHRASES = [("气候", "zh_climate.txt"), ("粮食产量", "zh_climate.txt"), ("高速铁路", "zh_rail.txt"),
           ("经济", "zh_rail.txt"),
           ("花見", "ja_sakura.txt"), ("開花予想", "ja_sakura.txt"), ("職人", "ja_sushi.txt"), ("老舗", "ja_sushi.txt"),
           ("고춧가루", "ko_kimchi.txt"), ("김장", "ko_kimchi.txt"), ("지하철", "ko_subway.txt"),
           ("혼잡", "ko_subway.txt")]
LONG = [("极端天气事件", "zh_climate.txt"), ("伝統的な技術", "ja_sushi.txt"), ("대중교통요금", "ko_subway.txt")]
LATIN = [("spiral stairs", "en_lighthouse.txt"), ("leather-bound journal", "en_lighthouse.txt")]
MODES = ("bm25", "hybrid")
SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def write_corpus(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in CORPUS.items():
        (folder / name).write_text(text + "\n", encoding="utf-8")


def sample_phrases() -> list[tuple[str, str]]:
    """(phrase, file) of each bundled sample, from the table of samples/README.md."""
    rows = [line.split("|") for line in (SAMPLES / "README.md").read_text().splitlines() if line.startswith("| `")]
    return [(cells[3].strip(), cells[1].strip(" `")) for cells in rows]


def found(uri: str, phrases: list[tuple[str, str]], collection: str) -> dict[str, list[str]]:
    """Per mode, the phrases whose first hit (k = 5; not the README, which holds every sample's phrase) is
    their file, searched as `ingest search` searches."""
    from ingest.search import Searcher

    out: dict[str, list[str]] = {}
    with Searcher(uri, collection) as s:
        for mode in MODES:
            hits = s.search([p for p, _ in phrases], 5, s.mode(mode)[0])
            first = [next((Path(h["source"]).name for h in ranked if Path(h["source"]).name != "README.md"), None)
                     for ranked in hits]
            out[mode] = [p for (p, name), top in zip(phrases, first) if top == name]
    return out


def sets(samples: bool) -> dict[str, list[tuple[str, str]]]:
    """The phrases asked, by set."""
    return {"samples": sample_phrases()} if samples else {"cjk": PHRASES, "long": LONG, "latin": LATIN}


def measure(label: str, code: Path | None, store: str, uri: str, docs: Path, work: Path, samples: bool) -> dict:
    """One `ingest run` of `docs` into `uri`, then the phrases searched, with `code`'s ingest (None: this one)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    collection = "cjk_" + "".join(c if c.isalnum() else "_" for c in label)
    run = subprocess.run([sys.executable, "-m", "ingest.cli", "run", str(docs), "--store", uri, "--collection",
                          collection, "--report", str(work / f"{label}-{store}.json"), "--quiet"],
                         env=env, cwd=work, capture_output=True, text=True)
    if run.returncode not in (0, 1) or (run.returncode and not samples):     # a sample may fail (no LibreOffice)
        sys.exit(f"{label} {store}: ingest run failed ({run.returncode}): {run.stderr.strip()[-1000:]}")
    probe = subprocess.run([sys.executable, __file__, "--search", uri, "--collection", collection]
                           + ["--samples"] * samples, env=env, cwd=work, capture_output=True, text=True)
    if probe.returncode != 0:
        sys.exit(f"{label} {store}: search failed: {probe.stderr.strip()[-1000:]}")
    return json.loads(probe.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stores", default="milvus-lite,milvus-server,postgresql,qdrant-local,lancedb")
    parser.add_argument("--code", help="also measure this git revision's code (or a source tree)")
    parser.add_argument("--samples", action="store_true", help="the bundled samples and their README's phrases")
    parser.add_argument("--work", type=Path, help="a folder for the stores and reports (default: a temporary one)")
    parser.add_argument("--search", help=argparse.SUPPRESS)          # a child: search URI, print JSON
    parser.add_argument("--collection", default="documents", help=argparse.SUPPRESS)
    args = parser.parse_args()
    asked = sets(args.samples)
    if args.search:
        print(json.dumps({name: found(args.search, phrases, args.collection) for name, phrases in asked.items()},
                         ensure_ascii=False))
        return 0
    sys.path.insert(0, str(Path(__file__).parent))
    from feed import package_of
    from stores import STARTS

    with ExitStack() as stack:
        work = args.work or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cjk-keyword-")))
        work.mkdir(parents=True, exist_ok=True)
        docs = SAMPLES if args.samples else work / "docs"
        if not args.samples:
            write_corpus(docs)
        codes: list[tuple[str, Path | None]] = [("this", None)]
        if args.code:
            codes.insert(0, (args.code, package_of(args.code, Path(tempfile.mkdtemp(dir=work)))))
        for store in args.stores.split(","):
            uri, _ = stack.enter_context(STARTS[store](work))
            for label, code in codes:
                got = measure(label, code, store, uri, docs, work, args.samples)
                cells = [", ".join(f"{name} {len(got[name][m])}/{len(phrases)}" for name, phrases in asked.items())
                         for m in MODES]
                print(f"{store:14} {label:10} " + "   ".join(f"{m}: {c}" for m, c in zip(MODES, cells)), flush=True)
                missed = {m: [p for name, phrases in asked.items() for p, _ in phrases if p not in got[name][m]]
                          for m in MODES}
                print(f"{'':25} missed: {json.dumps(missed, ensure_ascii=False)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
