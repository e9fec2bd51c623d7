"""Does a policy copy the localized world's frame into its tool calls?

A localized statement quotes the broken line as a traceback frame (``File "<path>", line
<n>, in <function>`` and the line's text; docs/tasks.md, "The localized world"). A policy
that fixes held-out code has to copy that frame: the path and the line into ``view``, the
quoted text into ``str_replace``'s ``old_str``. This prints, over every tool call of the
given rollouts:

* ``view``: calls; how many name the frame's path, its exact line, a line within 5;
* ``str_replace``: calls; how many have ``old_str`` equal to the quoted text, how many the
  editor applied;
* episodes, and how many have at least one exact-line ``view``.

Input: an ``eval.run`` output folder's ``rollouts.jsonl`` (``--rollouts``) or a
``benchmarks/warmstart_quality.py --json`` file (``--quality``, every decoding mode); the
statements come from ``--tasks`` (an ``eval.tasks.splits.load_tasks`` source of a localized
world, loaded for evaluation).

    python benchmarks/frame_copy.py --tasks procedural-localized:heldout --rollouts OUT/rollouts.jsonl
    python benchmarks/frame_copy.py --tasks procedural-localized:train --quality wq.json
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.tasks.splits import load_tasks  # noqa: E402
from sandbox.bounds import ArgumentParser, InFile, Source  # noqa: E402

FRAME = re.compile(r'  File "(.+?)", line (\d+), in .+\n    (.+)\n')
CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


def frame_of(statement: str, task_id: str) -> tuple[str, int, str]:
    """``(path, line, quoted text)`` of the statement's first frame.

    Raises: ValueError naming the task when the statement quotes no frame.
    """
    m = FRAME.search(statement)
    if not m:
        raise ValueError(f"task {task_id}: the problem statement quotes no frame "
                         "(not a localized world's task)")
    return m.group(1), int(m.group(2)), m.group(3)


def tally(episodes: list[tuple[str, list[dict]]], frames: dict[str, tuple[str, int, str]]
          ) -> Counter:
    """Counts over ``(task id, tool calls)`` episodes; a call is ``{"name", "arguments",
    "ok"}`` (``ok`` None when unknown). Raises: KeyError for a task without a frame."""
    c: Counter = Counter()
    for tid, calls in episodes:
        path, line, text = frames[tid]
        c["episodes"] += 1
        hit = False
        for call in calls:
            a = call.get("arguments") or {}
            if call["name"] == "view":
                c["view"] += 1
                c["view_path"] += a.get("path") == path
                try:
                    got = int(a.get("line"))
                except (TypeError, ValueError):
                    continue
                c["view_line"] += got == line
                c["view_line_within_5"] += abs(got - line) <= 5
                hit = hit or got == line
            elif call["name"] == "str_replace":
                c["str_replace"] += 1
                c["old_str_is_frame_text"] += a.get("old_str") == text
                c["str_replace_applied"] += call.get("ok") is True
        c["episodes_with_view_line"] += hit
    return c


def rollout_episodes(path: Path) -> list[tuple[str, list[dict]]]:
    """Episodes of an ``eval.run`` ``rollouts.jsonl``."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [(r["task_id"], [{"name": t["name"], "arguments": t.get("arguments"),
                             "ok": t.get("ok")} for t in r.get("tool_calls", [])])
            for r in rows]


def quality_episodes(path: Path) -> dict[str, list[tuple[str, list[dict]]]]:
    """Episodes of a ``warmstart_quality.py --json`` file, per decoding mode (the turn
    texts parsed; ``ok`` unknown but for ``str_replace``: the turn's ``valid``)."""
    out = {}
    for mode, by_task in json.loads(path.read_text())["episodes"].items():
        eps = []
        for tid, episodes in by_task.items():
            for e in episodes:
                calls = []
                for turn in e["turns"]:
                    for raw in CALL.findall(turn["text"]):
                        try:
                            call = json.loads(raw)
                        except json.JSONDecodeError:
                            continue
                        if isinstance(call, dict) and isinstance(call.get("name"), str):
                            calls.append({"name": call["name"],
                                          "arguments": call.get("arguments"),
                                          "ok": turn.get("valid")})
                eps.append((tid, calls))
        out[mode] = eps
    return out


def main(argv=None) -> int:
    ap = ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=Source(), required=True,
                    help="the localized tasks the episodes played (load_tasks source)")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--rollouts", type=InFile(), help="an eval.run rollouts.jsonl")
    src.add_argument("--quality", type=InFile(), help="a warmstart_quality.py --json file")
    a = ap.parse_args(argv)
    if not (a.rollouts or a.quality):
        ap.error("one of --rollouts, --quality is required")
    frames = {t.instance_id: frame_of(t.problem_statement, t.instance_id)
              for t in load_tasks(a.tasks, purpose="eval")}
    modes = ({"rollouts": rollout_episodes(Path(a.rollouts))} if a.rollouts
             else quality_episodes(Path(a.quality)))
    for mode, eps in modes.items():
        c = tally(eps, frames)
        print(f"{mode}: {c['episodes']} episodes, {c['episodes_with_view_line']} with a view "
              f"of the frame's line")
        print(f"  view {c['view']}: frame's path {c['view_path']}, exact line "
              f"{c['view_line']}, within 5 lines {c['view_line_within_5']}")
        print(f"  str_replace {c['str_replace']}: old_str = the quoted text "
              f"{c['old_str_is_frame_text']}, applied {c['str_replace_applied']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
