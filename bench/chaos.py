"""Chaos soak: `ingest run` over a changing mixed corpus while random processes of the run are killed.

    python bench/chaos.py --rounds 3 --backend null        # a quick check (null vectors are constant)
    python bench/chaos.py --rounds 50 --seed 1             # the benchmark (the real model, torch)
    python bench/chaos.py --store http://127.0.0.1:19530   # a Milvus server instead of a Lite file
    python bench/chaos.py --faulty-store postgres --kinds store --rounds 20 --backend null    # store faults only

With --faulty-store STORE (postgres, milvus, lite, lancedb) the bench makes the store itself (a server of its own,
or an embedded store on a tmpfs of its own) and its faults join the kinds (bench/store_faults.py: a restart, cut
connections, a stalled server, a full disk); `--kinds store` picks among those alone. A run after a store fault
must finish (rc 0: it rode the fault out) or stop with one line and a fresh report (rc 2: a rerun resumes); the
summary counts the outcomes of each fault kind.

Each round: (from round 2) change one or two files, delete one, add one; the reference is what a
clean run into a fresh store gives for each file version (cached per name and content hash); start `ingest run --prune` on the
chaos store, which keeps every earlier round's rows; after a random delay send SIGKILL or SIGTERM to
a random process of a random kind among those alive then (supervisor, loader, ocr, tokenizer,
encode, writer, lite host; each child names itself ingest-<role>); rerun until rc 0. Then the chaos
store must equal the reference: same ids, same rows, vectors within cosine 0.9999, no duplicate,
orphan or stale row, the same manifest entries (Lite), no process of the round alive (found by an
environment marker every process of a run inherits) and no temp file in the store dir, the report
dir, the corpus or the runs' TMPDIR. Expected exits: SIGTERM to the supervisor 143 with a fresh
report (or, signalled as the run ended, its own code); SIGKILL to it -9; a killed child 0, 1 or 2
with a fresh report; every fresh report's totals.exit_code equals the exit status. Exit status 1 on any
mismatch, leftover or unexpected exit.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(Path(__file__).parent)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from docs import Slide, make_docx, make_pdf, make_pptx, make_scanned_pdf  # noqa: E402
from store_faults import FAULTS, StoreFaults  # noqa: E402
from ingest.outputs import html_path  # noqa: E402
from ingest.store import local_path, redact  # noqa: E402
from pipeline import machine  # noqa: E402

KINDS = ("supervisor", "loader", "ocr", "tokenizer", "encode", "writer", "lite host")
ROLE_KIND = {"txt": "loader", "pdf": "loader", "docx": "loader", "pptx": "loader", "ocr": "ocr",
             "tokenize": "tokenizer", "encode": "encode", "writer": "writer", "lite": "lite host"}
SIGNALS = (signal.SIGKILL, signal.SIGTERM)
MARK = "INGEST_CHAOS_MARK"          # every process of a run inherits it: how leftovers are found
COLLECTION = "documents"
FIELDS = ["id", "source", "file_hash", "chunk", "page", "format", "text", "vector"]
MIN_COSINE, LEFTOVER_GRACE_S, MAX_RESUMES = 0.9999, 15.0, 5
WORDS = ("river mountain engine harbour lantern orchard copper glacier violin meadow falcon circuit "
         "canyon archive thunder pepper compass marble ribbon saddle quartz tunnel beacon walnut").split()
# Kept in TMPDIR by design, reused by every later process: ONNX Runtime's (RapidOCR's) session id, torch's cache.
TMP_KEPT = (".ses", "torchinductor_")
SCAN_WORDS = ("COPPER LANTERN", "RIVER FALCON", "MARBLE BEACON", "QUARTZ TUNNEL", "WALNUT SADDLE")

_DUMP = """
import json, sqlite3, sys
from ingest.store import is_local, local_path
from ingest.store.factory import open_store
from ingest.store.manifest import manifest_path
uri, collection, fields = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
store = open_store(uri, collection)
rows = store.rows(fields) if store.exists() else []
store.close()
staged = 0                 # LanceDB: rows left in the staging table after a finished run are leftovers
if uri.startswith("lancedb://"):
    import lancedb
    db = lancedb.connect(str(local_path(uri)))
    if collection + "__staged" in db.table_names():
        staged = db.open_table(collection + "__staged").count_rows()
manifest = {}
if is_local(uri) and manifest_path(uri, collection).exists():
    db = sqlite3.connect(str(manifest_path(uri, collection)))
    manifest = {s: [h, st, n] for s, h, st, n in db.execute("select source, file_hash, status, chunks from files")}
    db.close()
print(json.dumps({"rows": rows, "manifest": manifest, "staged": staged}, default=float))
"""


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Corpus:
    """The folder of mixed documents and its changes between rounds (all drawn from the bench's rng)."""
    BUILD = {"txt": lambda p, r: p.write_text("\n\n".join(words(r, 120) + "." for _ in range(r.randint(2, 4)))),
             "pdf": lambda p, r: make_pdf(p, [words(r, 150), words(r, 120)]),
             "scan": lambda p, r: make_scanned_pdf(p, [r.choice(SCAN_WORDS)], size=(300.0, 120.0)),
             "docx": lambda p, r: make_docx(p, [words(r, 60) for _ in range(4)], heading=words(r, 3)),
             "pptx": lambda p, r: make_pptx(p, [Slide(title=words(r, 3), body=words(r, 40), notes=words(r, 20)),
                                                Slide(title=words(r, 2), body=words(r, 30))])}
    EXT = {"txt": "txt", "pdf": "pdf", "scan": "pdf", "docx": "docx", "pptx": "pptx"}

    def __init__(self, folder: Path, rng: random.Random, light: bool = False):
        self.folder, self.rng, self.count, self.light = folder, rng, 0, light      # light: text files only
        folder.mkdir(parents=True)
        for kind in ("txt",) * 10 if light else ("txt", "txt", "txt", "pdf", "pdf", "scan", "docx", "docx", "pptx", "pptx"):
            self.add(kind)

    def files(self) -> list[Path]:
        return sorted(self.folder.iterdir())

    def kind(self, path: Path) -> str:
        return path.name.split("-")[0]

    def add(self, kind: str) -> Path:
        self.count += 1
        path = self.folder / f"{kind}-{self.count:03d}.{self.EXT[kind]}"
        self.BUILD[kind](path, self.rng)
        return path

    def mutate(self) -> list[str]:
        """Change one or two files (a scanned page at times), delete one, add one; 8 to 12 files, <= 2 scans."""
        rng, done = self.rng, []
        files = self.files()
        scans = [p for p in files if self.kind(p) == "scan"]
        pick = [rng.choice(scans)] if scans and rng.random() < 0.3 else []
        pick += rng.sample([p for p in files if p not in pick], max(0, rng.randint(1, 2) - len(pick)))
        for path in pick:
            self.BUILD[self.kind(path)](path, rng)
            done.append(f"~{path.name}")
        for _ in range(1 + (len(files) >= 12)):
            path = rng.choice([p for p in self.files() if p not in pick])
            path.unlink()
            done.append(f"-{path.name}")
        scans = [p for p in self.files() if self.kind(p) == "scan"]
        for _ in range(1 + (len(self.files()) < 8)):
            kind = "txt" if self.light else rng.choice(["txt", "pdf", "docx", "pptx"] + ["scan"] * (len(scans) < 2))
            done.append(f"+{self.add(kind).name}")
        return done


@dataclass
class Attempt:
    rc: int
    wall: float
    kill: tuple[str, str, str, float] | None = None         # kind, process name, signal, at seconds
    missed: bool = False                                    # the run ended (or the target died) first
    report_fresh: bool = False
    report_code: int | None = None                          # the fresh report's totals.exit_code
    leftovers: list[str] = field(default_factory=list)
    stderr: str = ""


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work = args, work
        self.rng = random.Random(args.seed)
        self.tmp = work / "tmp"                  # the runs' TMPDIR: anything left there is a leftover
        self.tmp.mkdir()
        self.store_dir = work / "store"          # the chaos store (embedded), its lock, manifest and report
        self.faults = StoreFaults.start(args.faulty_store, work, self.rng, args.store_timeout) \
            if args.faulty_store else None      # a store of the bench's own, and its faults
        self.store_dir.mkdir(exist_ok=True)
        self.uri = self.faults.uri(Path(args.store).stem) if self.faults else args.store if "://" in args.store \
            else str(self.store_dir / Path(args.store).name)
        self.server = local_path(self.uri) is None
        self.collection = f"chaos_{os.getpid()}" if self.server else COLLECTION
        # On a disk the bench fills, the report would go with the store: it lives beside the corpus instead.
        self.report = (work / "reports" if self.faults and not self.server else self.store_dir) / "report.json"
        self.report.parent.mkdir(exist_ok=True)
        self.kinds = [k for k in args.kinds if k != "store"] + \
            [k for k in (self.faults.kinds if self.faults else ()) if "store" in args.kinds or k in args.kinds]
        self.outcomes: Counter[tuple[str, str]] = Counter()     # store fault kind, how its run ended
        self.stop_lines: dict[str, Counter[str]] = {}            # store fault kind: the runs' one-line errors
        self.seen: set[str] = set()              # kinds seen alive in any run
        self.kills: Counter[tuple[str, str]] = Counter()
        self.walls: list[float] = []             # runs not killed: what a kill's delay is drawn from
        self.clean: dict[str, dict] = {}         # file version -> its rows and manifest entry in a clean run

    # -- one `ingest run` --------------------------------------------------------------
    def ingest(self, folder: Path, uri: str, collection: str, report: Path, mark: str,
               kill_at: float | None = None) -> Attempt:
        """Run `ingest run --prune`, its processes marked `mark`; signal one of them at `kill_at` seconds."""
        argv = [sys.executable, "-m", "ingest.cli", "run", str(folder), "--store", uri, "--collection", collection,
                "--report", str(report), "--quiet", "--prune", "--backend", self.args.backend]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TMPDIR=str(self.tmp), **{MARK: mark})
        start = time.time()
        proc = subprocess.Popen(argv, cwd=self.work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        stderr: list[str] = []
        reader = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)
        reader.start()
        top = psutil.Process(proc.pid)
        kill, missed = None, False
        deadline = time.monotonic() + self.args.attempt_timeout
        while proc.poll() is None and time.monotonic() < deadline:
            self.seen.update(self.alive(top))
            if kill_at is not None and kill is None and not missed and time.time() - start >= kill_at:
                kill, missed = self.strike(top, time.time() - start)
            time.sleep(0.05)
        if proc.poll() is None:                                  # a hang: a mismatch, and cleared
            proc.kill()
            stderr.append(f"[chaos] hung past {self.args.attempt_timeout} s, killed")
        rc, wall = proc.wait(), time.time() - start
        if self.faults:
            self.faults.heal()                                   # the fault over before anything is checked
        reader.join(10)
        (self.work / "logs").mkdir(exist_ok=True)
        (self.work / "logs" / f"{mark.rsplit('/', 1)[-1].replace(':', '-')}.log").write_text("".join(stderr))
        missed = missed or (kill_at is not None and kill is None)
        code = _report_code(report) if report.exists() and report.stat().st_mtime >= start else False
        return Attempt(rc, wall, kill, missed, code is not False, None if code is False else code,
                       self.leftovers(mark), "".join(stderr))

    def alive(self, top: psutil.Process) -> dict[str, list[psutil.Process]]:
        """The run's processes that have a kind, by kind (the supervisor is the top process)."""
        out: dict[str, list[psutil.Process]] = {"supervisor": [top]}
        try:
            for p in top.children(recursive=True):
                name = p.name()
                kind = "soffice" if name.startswith("soffice") else \
                    ROLE_KIND.get(name[7:], name[7:]) if name.startswith("ingest-") else None
                if kind:
                    out.setdefault(kind, []).append(p)
        except psutil.Error:               # the run (or a child) just ended: the next poll sees the rest
            pass
        return out

    def strike(self, top: psutil.Process, at: float) -> tuple[tuple[str, str, str, float] | None, bool]:
        """Signal a random process of a random kind alive now."""
        alive = {k: ps for k, ps in self.alive(top).items() if k in self.kinds}
        alive.update((k, []) for k in self.kinds if k in FAULTS.get(self.args.faulty_store, ()))
        if not alive:
            return None, True
        kind = self.rng.choice(sorted(alive))
        if not alive[kind]:                                      # a store fault
            self.seen.add(kind)
            self.kills[(kind, "fault")] += 1
            return (kind, self.faults.strike(kind), "fault", at), False
        target = self.rng.choice(alive[kind])
        sig = self.rng.choice(SIGNALS)
        try:
            name = target.name()
            os.kill(target.pid, sig)
        except (psutil.Error, ProcessLookupError):
            return None, True
        self.kills[(kind, sig.name)] += 1
        return (kind, name, sig.name, at), False

    def leftovers(self, mark: str) -> list[str]:
        """Processes still alive with this run's marker once LEFTOVER_GRACE_S passed; they are killed."""
        deadline = time.monotonic() + LEFTOVER_GRACE_S
        while True:
            found = []
            for p in psutil.process_iter():
                try:
                    if p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARK) == mark:
                        found.append(p)
                except psutil.Error:
                    pass
            if not found or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        out = []
        for p in found:
            try:
                out.append(f"{p.name()} (pid {p.pid}, parent {p.ppid()})")
                p.kill()
            except psutil.Error:
                pass
        return out

    # -- the reference and the checks ----------------------------------------------------
    def dump(self, uri: str, collection: str) -> dict:
        """Rows and manifest entries, read by a separate process (Milvus Lite locks its file)."""
        env = dict(os.environ, HF_HUB_OFFLINE="1", TMPDIR=str(self.tmp))
        proc = subprocess.run([sys.executable, "-c", _DUMP, uri, collection, ",".join(FIELDS)], capture_output=True,
                              text=True, env=env, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"reading {uri} failed: {proc.stderr.strip()[-500:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def reference(self, corpus: Corpus) -> tuple[dict, float]:
        """What a clean run stores for the corpus as it is now. Rows and manifest entries are a file's own
        (ids hash source, chunk and text), so they are cached per file version (name, content hash): a
        clean run, into a fresh store, ingests only the versions not seen before, in a folder of their own
        under the same names; the reference is the cached rows of every current file."""
        fresh = [p for p in corpus.files() if version(p) not in self.clean]
        wall = 0.0
        if fresh:
            out = self.work / "clean" / f"run{len(self.clean)}"
            (out / "docs").mkdir(parents=True)
            for p in fresh:
                shutil.copy2(p, out / "docs" / p.name)
            uri = self.uri if self.server else f"lancedb://{out / 'clean.lance'}" \
                if self.uri.startswith("lancedb://") else str(out / "clean.db")
            collection = f"chaos_clean_{os.getpid()}_{len(self.clean)}" if self.server else COLLECTION
            attempt = self.ingest(out / "docs", uri, collection, out / "report.json", f"{self.work}:clean")
            if attempt.rc != 0:
                raise RuntimeError(f"a clean run exited {attempt.rc}: {attempt.stderr.strip()[-800:]}")
            got, wall = self.dump(uri, collection), attempt.wall
            for p in fresh:
                self.clean[version(p)] = {"rows": [r for r in got["rows"] if r["source"] == p.name],
                                          "manifest": got["manifest"].get(p.name)}
            shutil.rmtree(out)
            if self.server:
                self.drop(collection)
        cached = [(p.name, self.clean[version(p)]) for p in corpus.files()]
        return {"rows": [r for _, c in cached for r in c["rows"]],
                "manifest": {name: c["manifest"] for name, c in cached if c["manifest"] is not None}}, wall

    def drop(self, collection: str) -> None:
        code = ("import sys; from ingest.store.factory import open_store\n"
                "for n in (sys.argv[2], sys.argv[2] + '__files'):\n"
                "    s = open_store(sys.argv[1], n)\n    s.exists() and s.drop()")
        subprocess.run([sys.executable, "-c", code, self.uri, collection], capture_output=True, timeout=120)

    def compare(self, ref: dict, got: dict, files: list[str]) -> list[str]:
        out: list[str] = []
        want = {r["id"]: r for r in ref["rows"]}
        have: dict[str, dict] = {}
        current = {r["source"]: r["file_hash"] for r in ref["rows"]}
        for r in got["rows"]:
            if r["id"] in have:
                out.append(f"duplicate id {r['id']} ({r['source']})")
            have[r["id"]] = r
        for rid in sorted(have.keys() - want.keys()):
            r = have[rid]
            what = "stale row of a deleted file" if r["source"] not in files else \
                "orphan row of another version" if current.get(r["source"]) != r["file_hash"] else "extra row"
            out.append(f"{what}: {r['source']} chunk {r['chunk']} ({r['file_hash'][:8]})")
        out += [f"missing row: {want[rid]['source']} chunk {want[rid]['chunk']}"
                for rid in sorted(want.keys() - have.keys())]
        for rid in sorted(want.keys() & have.keys()):
            a, b = want[rid], have[rid]
            fields = [f for f in FIELDS if f != "vector" and a[f] != b[f]]
            va, vb = np.asarray(a["vector"], np.float64), np.asarray(b["vector"], np.float64)
            cos = float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)))
            if fields or cos < MIN_COSINE:
                out.append(f"row differs: {a['source']} chunk {a['chunk']} ({', '.join(fields)} cosine {cos:.6f})")
        if got.get("staged"):
            out.append(f"{got['staged']} rows left in the staging table")
        if not self.server and ref["manifest"] != got["manifest"]:
            diff = sorted(k for k in ref["manifest"].keys() | got["manifest"].keys()
                          if ref["manifest"].get(k) != got["manifest"].get(k))
            out.append(f"manifest differs for {', '.join(diff)}")
        return out

    def temp_files(self, files: list[str]) -> list[str]:
        """Files no finished run leaves: in the runs' TMPDIR, the corpus, the store and report dir."""
        out = [f"TMPDIR: {p.name}" for p in self.tmp.iterdir() if not p.name.startswith(TMP_KEPT)]
        out += [f"corpus: {name}" for name in sorted(set(os.listdir(self.work / "corpus")) - set(files))]
        store = local_path(self.uri).name if not self.server else ""
        # A finished run keeps its report and the report's HTML page (ingest/outputs.py names them), and the
        # manifest's reserve (ingest/store/manifest.py NOTE: reserve); its spool and .tmp files it removes
        # (ingest/report.py NOTE), so one of those left is a true leftover.
        manifest = f"{store}.{self.collection}.manifest.sqlite"
        allowed = {store, f"{store}.lock", manifest, f"{manifest}.reserve", self.report.name,
                   html_path(self.report).name}
        out += [f"store dir: {p.name}" for p in self.store_dir.iterdir() if p.name not in allowed]
        if self.report.parent != self.store_dir:
            out += [f"report dir: {p.name}" for p in self.report.parent.iterdir() if p.name not in allowed]
        if store and (self.store_dir / store).is_dir():
            out += [f"store: {p.relative_to(self.store_dir)}" for p in (self.store_dir / store).rglob("*")
                    if p.is_file() and (".tmp" in p.name or ".database-staging" in p.parts)]
        return out

    # -- a round ---------------------------------------------------------------------------
    def round(self, n: int, corpus: Corpus) -> dict:
        t0 = time.perf_counter()
        changes = corpus.mutate() if n > 1 else []
        files = [p.name for p in corpus.files()]
        ref, clean_s = self.reference(corpus)
        if not self.walls:
            self.walls.append(clean_s)
        est = statistics.median(self.walls[-5:])
        kill_at = self.rng.uniform(0.2, max(1.0, 0.85 * est))      # most runs of a round do less than est
        mark = f"{self.work}:{n}"
        attempts = [self.ingest(corpus.folder, self.uri, self.collection, self.report, f"{mark}:0", kill_at)]
        problems = [f"unexpected exit: {why}" for why in [_unexpected(attempts[0])] if why]
        if attempts[0].kill and attempts[0].kill[2] == "fault":
            kind, a = attempts[0].kill[0], attempts[0]
            self.outcomes[(kind, "finished" if a.rc == 0 else f"stopped, rc {a.rc}")] += 1
            if a.rc:
                last = (a.stderr.strip().splitlines() or ["(no stderr)"])[-1]
                self.stop_lines.setdefault(kind, Counter())[" ".join(w if not any(c.isdigit() for c in w) else "#"
                                                                   for w in last.split())[:200]] += 1
        while attempts[-1].rc != 0 and len(attempts) <= MAX_RESUMES:
            attempts.append(self.ingest(corpus.folder, self.uri, self.collection, self.report, f"{mark}:{len(attempts)}"))
            if attempts[-1].rc != 0:
                time.sleep(1 if not self.server else 10)         # a dead run's server lease may still hold
        self.walls += [a.wall for a in attempts if a.kill is None]
        if attempts[-1].rc != 0:
            problems.append(f"no resume reached rc 0 in {MAX_RESUMES} reruns (last rc {attempts[-1].rc}: "
                            f"{attempts[-1].stderr.strip()[-300:]})")
        problems += [f"unexpected exit of resume {i}: {why}" for i, a in enumerate(attempts[1:], 1)
                     if (why := _unexpected(a))]
        leftovers = [f"process: {p}" for a in attempts for p in a.leftovers] + self.temp_files(files)
        problems += self.compare(ref, self.dump(self.uri, self.collection), files)
        return {"round": n, "files": len(files), "changes": changes, "clean_s": clean_s,
                "kill": attempts[0].kill, "missed": attempts[0].missed, "rcs": [a.rc for a in attempts],
                "problems": problems, "leftovers": leftovers, "seconds": time.perf_counter() - t0,
                "est_s": est, "kill_at": kill_at}


def version(path: Path) -> str:
    return f"{path.name}:{hashlib.sha256(path.read_bytes()).hexdigest()}"


def _report_code(path: Path) -> int | None | bool:
    """The report's totals.exit_code (None if it has none); False if it is not a JSON report."""
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return report.get("totals", {}).get("exit_code") if isinstance(report, dict) else False


def _unexpected(a: Attempt) -> str | None:
    """Why this attempt's exit breaks the contract, or None."""
    if "[chaos] hung" in a.stderr:
        return f"hung (killed after the attempt timeout); stderr: {a.stderr.strip()[-300:]}"
    if a.kill and a.kill[2] == "fault":      # a store fault: ride it out (0) or stop in one line (2), no traceback
        last = (a.stderr.strip().splitlines() or [""])[-1]
        if a.rc not in (0, 2) or "Traceback" in a.stderr or (a.rc == 2 and not last.startswith("ingest: error: ")):
            return f"rc {a.rc} after {a.kill[0]}: {a.stderr.strip()[-300:]}"
        if a.rc == 2 and a.kill[0] == "disk full" and "disk full" not in last:        # the cause the run saw, named
            return f"a full disk said otherwise: {last[:300]}"
    if a.kill and a.kill[0] == "supervisor":
        if a.kill[2] == "SIGKILL":
            return None if a.rc == -9 else f"SIGKILL to the supervisor gave rc {a.rc}"
        if a.rc not in (0, 1, 2, 143):         # 143, or the run's own code when it had ended (the report says)
            return f"SIGTERM to the supervisor gave rc {a.rc}, report {'written' if a.report_fresh else 'NOT written'}"
    elif a.rc not in (0, 1, 2):
        return f"rc {a.rc} ({a.kill[0] if a.kill else 'no kill'}): {a.stderr.strip()[-300:]}"
    if not a.report_fresh:
        return f"rc {a.rc} without a fresh report ({a.kill[0] if a.kill else 'no kill'})"
    return None if a.report_code == a.rc else f"rc {a.rc} but the report says exit_code {a.report_code}"


def show(r: dict) -> None:
    kill = "ended before the kill" if r["missed"] else \
        f"{r['kill'][0]}: {r['kill'][1]} at {r['kill'][3]:.1f} s" if r["kill"] and r["kill"][2] == "fault" else \
        f"{r['kill'][2]} {r['kill'][0]} ({r['kill'][1]}) at {r['kill'][3]:.1f} s" if r["kill"] else "no kill"
    ok = "ok" if not (r["problems"] or r["leftovers"]) else f"{len(r['problems'])} mismatches, {len(r['leftovers'])} leftovers"
    print(f"round {r['round']:>3}  {r['files']:>2} files {' '.join(r['changes']) or '(initial)'}\n"
          f"           {kill} -> rc {' -> '.join(map(str, r['rcs']))}; clean run {r['clean_s']:.1f} s, "
          f"round {r['seconds']:.1f} s: {ok}", flush=True)
    for line in r["problems"] + r["leftovers"]:
        print(f"           ! {line}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="torch", help="encode backend of every run (default torch: the real "
                    "model; null for quick checks: constant vectors, so only ids and rows are compared)")
    ap.add_argument("--store", default="chaos.db", help="a Lite file name (in the work dir) or a server URI")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (kept anyway after a mismatch)")
    ap.add_argument("--kinds", type=lambda v: v.split(","), default=[*KINDS, "store"],
                    help=f"the kinds of process that may be signalled (default all: {','.join(KINDS)}), and of "
                    "store fault (with --faulty-store; 'store': all of that store's)")
    ap.add_argument("--light", action="store_true", help="a corpus of text files only (no PDF, Office or OCR "
                    "pools: rounds several times shorter, for the store faults)")
    ap.add_argument("--faulty-store", choices=sorted(FAULTS), help="make the store here and add its faults")
    ap.add_argument("--store-timeout", type=float, default=10.0, help="[store] timeout_s of every run (default "
                    "10 s; a stall lasts 1 to 1.5 times it)")
    ap.add_argument("--attempt-timeout", type=float, default=600, help="seconds before a run counts as hung")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="chaos-"))
    (work / "config.toml").write_text(f"[store]\ntimeout_s = {args.store_timeout}\n")    # the runs' cwd
    bench = Bench(args, work)
    print(f"chaos: {args.rounds} rounds, seed {args.seed}, backend {args.backend}, store {redact(bench.uri)}; "
          f"{machine()}; work dir {work}", flush=True)
    results = []
    try:
        corpus = Corpus(work / "corpus", bench.rng, args.light)
        for n in range(1, args.rounds + 1):
            results.append(bench.round(n, corpus))
            show(results[-1])
    except KeyboardInterrupt:
        print("chaos: interrupted", flush=True)
    finally:
        if bench.server:
            bench.drop(bench.collection)
        if bench.faults:
            bench.faults.close()
        bad = any(r["problems"] or r["leftovers"] for r in results)
        if args.keep or bad:
            print(f"chaos: work dir kept: {work} (logs/: each run's stderr)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    summarize(results, bench, args)
    return 1 if bad or not results else 0


def summarize(results: list[dict], bench: Bench, args: argparse.Namespace) -> None:
    if not results:
        return
    secs = [r["seconds"] for r in results]
    kills = ", ".join(f"{k} {s} {n}" for (k, s), n in sorted(bench.kills.items())) or "none"
    mismatches = len({p for r in results for p in r["problems"]})      # one that persists counts once
    leftovers = sum(len(r["leftovers"]) for r in results)
    print(f"\nrounds {len(results)}; kills {sum(bench.kills.values())} ({kills}); ended before the kill "
          f"{sum(r['missed'] for r in results)}; resumes {sum(len(r['rcs']) - 1 for r in results)}")
    print(f"kinds never seen alive: {', '.join(k for k in KINDS if k not in bench.seen) or 'none'}; "
          f"seen but never killed: {', '.join(sorted(k for k in bench.seen if k not in {k for k, _ in bench.kills})) or 'none'}")
    print(f"mismatches {mismatches} (rounds {[r['round'] for r in results if r['problems']]}), leftovers {leftovers} "
          f"(rounds {[r['round'] for r in results if r['leftovers']]})")
    for kind in sorted({k for k, _ in bench.outcomes}):
        ends = ", ".join(f"{how} {n}" for (k, how), n in sorted(bench.outcomes.items()) if k == kind)
        print(f"{kind}: {ends}")
        for line, n in bench.stop_lines.get(kind, Counter()).most_common(3):
            print(f"    {n} x {line}")
    print(f"seconds per round: mean {statistics.mean(secs):.1f}, median {statistics.median(secs):.1f}, "
          f"max {max(secs):.1f}; {args.rounds} rounds ~ {statistics.mean(secs) * args.rounds / 60:.0f} min")


if __name__ == "__main__":
    sys.exit(main())
