"""Training-step pipeline: ``pipeline: sequential`` vs ``overlapped`` on one seeded config.

Runs the main job twice from one invocation (each in its own process, same seed, same
config: the embedded policy, the bundled train tasks, Podman (or ``--runtime local`` on a
host without it), ``--rollouts`` rollouts
per step, ``--steps`` steps) and prints, per pipeline and step, from the run's own
records (``ledger.jsonl`` timing fields, TRL's ``step_time`` in ``metrics.jsonl``):

* busy seconds per stage: generation, tool execution, verification (unions of
  intervals: concurrent work counts once, see ``ecredit_trl.runs.timings``);
* the round wall (``wall_s``: environments, generation, tools, trials, scoring) and the
  step wall (TRL's ``step_time``: the round plus the optimizer step);
* ``round wall / max(stage busy)`` and ``overlapped / sequential`` walls;
* whether the two runs' records are identical except timings (the seeded contract);
* the trials' mean service time (container setup, apply + tests, cleanup) and queue wait;
* the CPU picture, sampled every 0.25 s while each run goes on: CPU seconds of the
  training process tree (psutil; the kernel's rusage of the reaped tree for the whole
  run), of the run's own containers (their cgroups, found by name), of every container on
  the machine, and machine utilisation from ``/proc/stat`` (over the generation rounds and
  over the whole run), so the table says whether a step was CPU-saturated and what floor
  its own CPU work puts under any reordering (other jobs on the machine show as ``other``).

Targets (this 2-core machine): overlapped step wall ≤ 0.7 × sequential,
round wall / max(stage busy) ≤ 1.3.

With ``--repeats 2`` the runs go sequential, overlapped, overlapped, sequential (a load
that drifts during the benchmark then weighs on both alike); figures are summed.

    python benchmarks/step_pipeline.py [--steps 3] [--rollouts 8] [--arm B] [--repeats 1]
                                       [--runtime podman|local] [--json out.json]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandbox.bounds import ArgumentParser, Choice, Int, OutFile

ROOT = Path(__file__).resolve().parent.parent
STAGES = (("generation", "generation_busy_s"), ("tools", "tool_busy_s"),
          ("verification", "verifier_busy_s"))
TIMING_KEYS = {"seconds", "queue_wait_s", "setup_s", "test_s", "apply_s", "cleanup_s",
               "service_s", "wall_s", "gpu_hours", "verify_s", "generation_busy_s",
               "tool_busy_s", "verifier_busy_s", "generation_wait_s", "verifier_idle_s",
               "rollout_setup_s", "endpoint"}


def without_timings(x):
    """``x`` (a record row) without timing fields and the per-run Podman endpoint."""
    if isinstance(x, dict):
        return {k: without_timings(v) for k, v in x.items() if k not in TIMING_KEYS}
    if isinstance(x, list):
        return [without_timings(v) for v in x]
    return x


# -- the CPU picture ---------------------------------------------------------------------
CGROUP_USAGE = ("/sys/fs/cgroup/cpuacct/libpod_parent/cpuacct.usage",  # cgroup v1 (ns)
                "/sys/fs/cgroup/cpu,cpuacct/libpod_parent/cpuacct.usage")
CGROUP_V2_STAT = ("/sys/fs/cgroup/libpod_parent/cpu.stat",)  # cgroup v2 (usage_usec)


def machine_cpu() -> tuple[float, float]:
    """``(busy, total)`` CPU seconds of the whole machine since boot (``/proc/stat``, first
    line; busy = user + nice + system + irq + softirq + steal, idle and iowait not busy)."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    busy = f[0] + f[1] + f[2] + f[5] + f[6] + f[7]
    return busy / hz, (busy + f[3] + f[4]) / hz


CGROUP_CONTAINERS = "/sys/fs/cgroup/cpuacct/libpod_parent"  # cgroup v1, cgroupfs manager
CONTAINERS_JSON = "/var/lib/containers/storage/overlay-containers/containers.json"


def containers_cpu() -> float | None:
    """CPU seconds used so far by every Podman container (and conmon) of this machine's
    ``libpod_parent`` cgroup (cgroupfs manager), or None when not readable. The parent's
    counter keeps what removed containers used."""
    for path in CGROUP_USAGE:
        try:
            return int(Path(path).read_text()) / 1e9
        except (OSError, ValueError):
            pass
    for path in CGROUP_V2_STAT:
        try:
            stat = dict(x.split() for x in Path(path).read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        except (OSError, ValueError, KeyError):
            pass
    return None


@dataclass
class RunContainers:
    """CPU seconds of one run's own containers (named ``ecredit-<run name>-...``: its
    verifier trials and agent sessions), from each container's cgroup while it exists
    (cgroup v1 ``cpuacct.usage``; the last reading of a removed container is kept, so up to
    one sampling period at its end is missed; conmon is not included)."""

    prefix: str | None = None
    names: dict[str, str | None] = field(default_factory=dict)  # cgroup id -> name
    usage: dict[str, float] = field(default_factory=dict)  # our container id -> CPU s
    readable: bool = True

    def _lookup(self, ids: list[str]) -> None:
        try:
            rows = json.loads(Path(CONTAINERS_JSON).read_text())
        except (OSError, ValueError):
            return  # being rewritten: next sample
        by_id = {r.get("id"): (r.get("names") or [None])[0] for r in rows}
        for i in ids:
            if i in by_id:
                self.names[i] = by_id[i]

    def sample(self) -> float | None:
        if self.prefix is None or not self.readable:
            return None if not self.readable else 0.0
        try:
            ids = [d.name[len("libpod-"):] for d in Path(CGROUP_CONTAINERS).iterdir()
                   if d.name.startswith("libpod-")]
        except OSError:
            self.readable = False
            return None
        new = [i for i in ids if i not in self.names]
        if new:
            self._lookup(new)
        for i in ids:
            name = self.names.get(i)
            if name and name.startswith(self.prefix):
                try:
                    usage = int(Path(CGROUP_CONTAINERS, f"libpod-{i}",
                                     "cpuacct.usage").read_text()) / 1e9
                except (OSError, ValueError):
                    continue
                self.usage[i] = max(usage, self.usage.get(i, 0.0))
        return sum(self.usage.values())


def tree_cpu(pid: int) -> float | None:
    """CPU seconds of process ``pid`` and its descendants, live or reaped by one of them
    (psutil; None when psutil is missing or the process is gone). Reaped children count
    from the moment they are reaped; a double-forked daemon (conmon) is not included."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        proc = psutil.Process(pid)
        t = proc.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in proc.children(recursive=True):
            try:
                c = child.cpu_times()  # with its reaped children (runc under the service)
                total += c.user + c.system + c.children_user + c.children_system
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return None


@dataclass
class CpuSample:
    """One sample (monotonic ``t``): machine busy/total CPU seconds, all containers' CPU
    seconds (None: unreadable), the training process tree's CPU seconds (None: unknown),
    ledger rows written so far, this run's own containers' CPU seconds (:class:`RunContainers`)."""

    t: float
    busy: float
    total: float
    containers: float | None
    tree: float | None
    rows: int
    own: float | None = None


@dataclass
class CpuSampler:
    """Samples :class:`CpuSample` every ``period_s`` while one training run goes on; the
    moments a new ledger row appears mark the ends of the generation rounds."""

    pid: int
    runs_dir: Path
    period_s: float = 0.25
    samples: list[CpuSample] = field(default_factory=list)
    own: RunContainers = field(default_factory=RunContainers)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        busy, total = machine_cpu()
        rows = 0
        for run_dir in self.runs_dir.iterdir():  # the run's directory, once it exists
            self.own.prefix = f"ecredit-{run_dir.name}-"
            try:
                rows = sum(1 for x in (run_dir / "ledger.jsonl").read_text().splitlines()
                           if x.strip())
            except OSError:
                pass
        tree = tree_cpu(self.pid)
        if tree is None and self.samples:  # the process just ended: keep its last reading
            tree = self.samples[-1].tree
        self.samples.append(CpuSample(time.monotonic(), busy, total, containers_cpu(), tree,
                                      rows, self.own.sample()))

    def loop(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def __enter__(self) -> CpuSampler:
        self.sample()
        self._thread = threading.Thread(target=self.loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def _delta(a: CpuSample, b: CpuSample, key: str) -> float | None:
    x, y = getattr(a, key), getattr(b, key)
    return None if x is None or y is None else y - x


CPU_KEYS = ("seconds", "machine_busy", "trainer_tree", "run_containers", "all_containers",
            "other")


def cpu_picture(samples: list[CpuSample], wall_s: list[float], ncpu: int,
                run_cpu_s: float | None) -> dict:
    """CPU seconds and machine utilisation of one run: over the whole process (``run``)
    and over its generation rounds (``rounds``: round k ends when ledger row k appeared,
    i.e. within one sampling period, and began ``wall_s[k]`` before; its first and last
    samples bound it). Utilisation = machine busy CPU seconds / (seconds × ``ncpu``);
    ``saturated`` = share of sampling periods with utilisation >= 0.9. ``trainer_tree``:
    the training process and its children (generation, git, the podman CLI and service);
    ``run_containers``: this run's containers (trials, agent sessions);
    ``all_containers``: every Podman container and conmon on the machine (other jobs' too);
    ``other`` = machine busy - trainer tree - run containers (other jobs, conmon, kernel)."""
    def span(a: CpuSample, b: CpuSample) -> dict:
        out = {"seconds": b.t - a.t, "machine_busy": b.busy - a.busy,
               "trainer_tree": _delta(a, b, "tree"), "run_containers": _delta(a, b, "own"),
               "all_containers": _delta(a, b, "containers")}
        if out["trainer_tree"] is not None and out["run_containers"] is not None:
            out["other"] = out["machine_busy"] - out["trainer_tree"] - out["run_containers"]
        return out

    run = span(samples[0], samples[-1])
    if run_cpu_s is not None:  # exact, from the kernel's rusage of the reaped process tree
        run["trainer_tree"] = run_cpu_s
        if run["run_containers"] is not None:
            run["other"] = run["machine_busy"] - run_cpu_s - run["run_containers"]
    rounds = []
    for k, w in enumerate(wall_s, start=1):
        end = next((i for i, s in enumerate(samples) if s.rows >= k), len(samples) - 1)
        t0 = samples[end].t - w
        start = max((i for i, s in enumerate(samples[:end]) if s.t <= t0), default=0)
        rounds.append(span(samples[start], samples[end]))
    periods = [(b.busy - a.busy, b.total - a.total)
               for a, b in zip(samples, samples[1:], strict=False)]
    sat = [busy / tot >= 0.9 for busy, tot in periods if tot > 0]
    return {"run": run, "rounds": rounds, "saturated": sum(sat) / max(len(sat), 1),
            "ncpu": ncpu}


def add_cpu(parts: list[dict], ncpu: int) -> dict | None:
    """Spans of :func:`cpu_picture` added up; ``util`` = machine busy / (seconds × ncpu)."""
    if not parts:
        return None
    out: dict = {}
    for k in CPU_KEYS:
        vals = [p.get(k) for p in parts]
        out[k] = None if any(v is None for v in vals) else sum(vals)
    out["util"] = out["machine_busy"] / max(out["seconds"] * ncpu, 1e-9)
    return out


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def train_command(pipeline: str, args, runs_dir: Path) -> list[str]:
    """The argv of one training run of the benchmark (``args``: its parsed flags)."""
    return [sys.executable, "-m", "ecredit_trl.train", "--arm", args.arm,
           "--pipeline", pipeline, "--max_steps", str(args.steps),
           "--per_device_train_batch_size", str(args.rollouts),
           "--num_generations", str(args.num_generations), "--seed", str(args.seed),
           "--verifier_concurrency", str(args.verifier_concurrency),
           "--agent_concurrency", str(args.agent_concurrency),
           "--save_strategy", "no", "--runs_dir", str(runs_dir), "--runtime", args.runtime]


def run(pipeline: str, args, runs_dir: Path) -> dict:
    """One training run; returns its ledger rows, step times and record rows."""
    cmd = train_command(pipeline, args, runs_dir)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("CONTAINERS_CONF", str(ROOT / "sandbox" / "containers.conf"))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    runs_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    with CpuSampler(proc.pid, runs_dir) as sampler:
        _, stderr = proc.communicate()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{pipeline} run failed ({proc.returncode}):\n{stderr[-4000:]}")
    (run_dir,) = list(runs_dir.iterdir())
    metrics = [m for m in _jsonl(run_dir / "metrics.jsonl") if "step_time" in m]
    ledger = _jsonl(run_dir / "ledger.jsonl")
    run_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"ledger": ledger, "step_time": [m["step_time"] for m in metrics],
            "trajectories": _jsonl(run_dir / "trajectories.jsonl"),
            "cpu": [cpu_picture(sampler.samples, [r["wall_s"] for r in ledger],
                                os.cpu_count() or 1, run_cpu)]}


def summary(res: dict) -> dict:
    """Totals over the steps: stage busy seconds, round and step walls, the ratio."""
    led = res["ledger"]
    out = {name: sum(r[key] for r in led) for name, key in STAGES}
    out["round_wall"] = sum(r["wall_s"] for r in led)
    out["step_wall"] = sum(res["step_time"])
    out["generation_wait"] = sum(r["generation_wait_s"] for r in led)
    out["verifier_idle"] = sum(r["verifier_idle_s"] for r in led)
    out["rollout_setup"] = sum(r["rollout_setup_s"] for r in led)
    out["ratio"] = out["round_wall"] / max(out[name] for name, _ in STAGES)
    out["trials"] = sum(r["trials_control"] + r["trials_factual"] + r["trials_counterfactual"]
                        + r.get("counterfactual_discarded", 0) for r in led)
    for k in ("setup_s", "verify_s", "cleanup_s", "queue_wait_s"):  # summed over trials
        out[k] = sum(r[k] for r in led)
    return out


def cpu_summary(pictures: list[dict]) -> dict:
    """The runs' :func:`cpu_picture` added up (their rounds, their whole runs); the
    saturated share weighted by run seconds."""
    ncpu = pictures[0]["ncpu"]
    out = {"rounds": add_cpu([r for p in pictures for r in p["rounds"]], ncpu),
           "run": add_cpu([p["run"] for p in pictures], ncpu), "ncpu": ncpu}
    secs = [p["run"]["seconds"] for p in pictures]
    out["saturated"] = sum(p["saturated"] * s for p, s in zip(pictures, secs, strict=True)) / (
        max(sum(secs), 1e-9))
    return out


def _s(x) -> str:
    return "   n/a" if x is None else f"{x:6.1f}"


def print_cpu(cpu: dict, seq: dict, ov: dict) -> None:
    """The CPU table and what it implies for the overlapped / sequential bound."""
    ncpu = cpu["sequential"]["ncpu"]
    print(f"\nCPU seconds ({ncpu} cores). trainer = the training process and its children "
          f"(generation, git, podman CLI and service); run-ctr = this run's containers "
          f"(trials, agent sessions); all-ctr = every container on the machine; other = "
          f"machine busy - trainer - run-ctr (other jobs, conmon, kernel); util = machine "
          f"busy / (seconds x {ncpu}); saturated = share of 0.25 s periods with util >= 0.9")
    print("pipeline     part    seconds  machine-busy  trainer  run-ctr  all-ctr   other  "
          "util  saturated")
    for p, c in cpu.items():
        for part in ("rounds", "run"):
            x = c[part]
            if x is None:
                continue
            sat = f"{c['saturated']:9.2f}" if part == "run" else ""
            print(f"{p:11}  {part:6}  {_s(x['seconds'])}  {_s(x['machine_busy']):>12}  "
                  f"{_s(x['trainer_tree']):>7}  {_s(x['run_containers']):>7}  "
                  f"{_s(x['all_containers']):>7}  {_s(x.get('other')):>6}  {x['util']:4.2f}  "
                  f"{sat}")
    rs = cpu["sequential"]["rounds"]
    if rs is not None and None not in (rs["trainer_tree"], rs["run_containers"]):
        own = rs["trainer_tree"] + rs["run_containers"]
        floor = own / ncpu
        print(f"sequential rounds used {own:.1f} CPU s of their own (trainer + run-ctr) in "
              f"{rs['seconds']:.1f} s ({own / max(rs['seconds'] * ncpu, 1e-9):.0%} of "
              f"{ncpu} cores): with the same work no order makes them shorter than "
              f"{floor:.1f} s, i.e. overlapped / sequential round wall >= "
              f"{floor / rs['seconds']:.2f} from CPU alone (measured "
              f"{ov['round_wall'] / seq['round_wall']:.2f})")


def parse_args(argv=None):
    """The benchmark's flags (every one declares its bounds)."""
    ap = ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=Int(ge=1), default=3)
    ap.add_argument("--rollouts", type=Int(ge=1), default=8, help="rollouts per step")
    ap.add_argument("--num-generations", type=Int(ge=2, why="a group needs two completions to compare"), default=4)
    ap.add_argument("--arm", type=Choice("O", "B", "M", "E"), default="B")
    ap.add_argument("--seed", type=Int(ge=0, le=2**32 - 1, why="32-bit seeds"), default=0)
    ap.add_argument("--verifier-concurrency", type=Int(ge=1), default=2)
    ap.add_argument("--agent-concurrency", type=Int(ge=1), default=8)
    ap.add_argument("--repeats", type=Int(ge=1), default=1)
    ap.add_argument("--runtime", type=Choice("podman", "local"), default="podman",
                    help="sandbox runtime of both runs (local: a host without Podman; its "
                         "container figures then read n/a)")
    ap.add_argument("--json", type=OutFile(), help="also write the results here")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)

    results: dict = {}
    order = []
    for k in range(args.repeats):
        pair = ["sequential", "overlapped"]
        order += pair if k % 2 == 0 else pair[::-1]
    with tempfile.TemporaryDirectory(prefix="step-pipeline-") as tmp:
        for n, pipeline in enumerate(order):
            print(f"running {pipeline} ...", flush=True)
            res = run(pipeline, args, Path(tmp) / f"{n}-{pipeline}")
            if pipeline in results:  # a repeat: same records expected, timings add up
                prev = results[pipeline]
                res = {k: prev[k] + res[k] for k in ("ledger", "step_time", "cpu")} | {
                    "trajectories": res["trajectories"]}
            results[pipeline] = res
    sums = {p: summary(r) for p, r in results.items()}
    same = ([without_timings(t) for t in results["sequential"]["trajectories"]]
            == [without_timings(t) for t in results["overlapped"]["trajectories"]]
            and [without_timings(r) for r in results["sequential"]["ledger"]]
            == [without_timings(r) for r in results["overlapped"]["ledger"]])

    print(f"\n{args.steps} steps x {args.rollouts} rollouts x {args.repeats} repeats, arm "
          f"{args.arm}, runtime {args.runtime}, load average {os.getloadavg()[0]:.1f} at the "
          f"end, verifier "
          f"concurrency {args.verifier_concurrency}, agent concurrency {args.agent_concurrency}")
    for p, res in results.items():
        print(f"\n{p}: step  generation  tools  verification  round-wall  step-wall  "
              f"wall/max(busy)")
        for r, st in zip(res["ledger"], res["step_time"], strict=True):
            mx = max(r[k] for _, k in STAGES)
            print(f"  {r['step']:>4}  {r['generation_busy_s']:10.2f}  {r['tool_busy_s']:5.2f}  "
                  f"{r['verifier_busy_s']:12.2f}  {r['wall_s']:10.2f}  {st:9.2f}  "
                  f"{r['wall_s'] / mx:14.2f}")
        s = sums[p]
        print(f"   all  {s['generation']:10.2f}  {s['tools']:5.2f}  {s['verification']:12.2f}  "
              f"{s['round_wall']:10.2f}  {s['step_wall']:9.2f}  {s['ratio']:14.2f}   "
              f"(gen waited on tools {s['generation_wait']:.2f} s, verifier idle "
              f"{s['verifier_idle']:.2f} s, env setup {s['rollout_setup']:.2f} s)")
        n = max(s["trials"], 1)
        service = (s["setup_s"] + s["verify_s"] + s["cleanup_s"]) / n
        print(f"        {s['trials']} trials, mean service {service:.2f} s (container setup {s['setup_s'] / n:.2f}, apply + tests "
              f"{s['verify_s'] / n:.2f}, cleanup {s['cleanup_s'] / n:.2f}), mean queue wait "
              f"{s['queue_wait_s'] / n:.2f} s")
    seq, ov = sums["sequential"], sums["overlapped"]
    print(f"\noverlapped / sequential: step wall {ov['step_wall'] / seq['step_wall']:.2f} "
          f"(target <= 0.70), round wall {ov['round_wall'] / seq['round_wall']:.2f}; "
          f"overlapped round wall / max(stage busy) {ov['ratio']:.2f} (target <= 1.30)")
    print(f"records identical except timings: {'yes' if same else 'NO'}")
    cpu = {p: cpu_summary(r["cpu"]) for p, r in results.items()}
    print_cpu(cpu, seq, ov)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": sums,
                                               "identical": same, "cpu": cpu,
                                               "ledger": {p: r["ledger"] for p, r in
                                                          results.items()},
                                               "step_time": {p: r["step_time"] for p, r in
                                                             results.items()}}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
