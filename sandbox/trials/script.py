"""The bash script every verifier trial runs inside its sandbox (both runtimes).

Steps, in order:

0. Only when ``checkout`` exists (a task whose base is a branch of the image's repository,
   SWE-smith): ``git checkout`` of that branch in ``workdir`` (local, else a new local one
   from ``origin/<branch>``: an image whose repository fetched the branches), before the artifact or
   the protected set is touched;
   a branch the image lacks ends the trial with exit 94 and a ``checkout-failed`` line
   (never a grade of the image's default tree).
1. ``oom-kills-start``: the sandbox cgroup's ``oom_kill`` counter (v2 ``memory.events``,
   v1 ``memory.oom_control``; ``na`` where neither is readable or ``ECREDIT_OOM_COUNTER=off``).
2. Stash the base content of the protected paths the artifact names
   (``protected.list``, NUL-separated, computed on the host by :mod:`sandbox.trials.protect`).
3. Apply the artifact **all or nothing**: each method of SWE-bench's chain is first
   checked with a dry run on the untouched base, and only a method whose dry run passed
   is run for real (``git apply``; else ``patch --forward --fuzz=5``, which never reverses
   a hunk). ``git apply --reject`` is not in the chain: it can only succeed where plain
   ``git apply`` succeeds, and otherwise leaves a half-applied tree. A real apply failing
   after its dry run passed is an apply failure (the tree is never retried).
4. Leftovers: ``*.rej`` / ``*.orig`` files the tools made (not named by the artifact) are
   removed; any other changed path the artifact does not name (``paths.list``) fails the
   apply (exit 95), so the test run never sees a tree we cannot describe.
5. Protection: every protected path the artifact names is removed and its base content put
   back; those whose content/mode/existence the artifact changed are reported as
   ``protected-touched <base64 path>`` lines (before ``test-start``, so nothing the tests
   print can add to them).
6. The task's eval script (``eval.sh``) between ``test-start`` / ``test-end`` markers.
7. Only when ``swebench.pass`` exists and a protected path was touched: the artifact's own
   versions of those paths are put back and ``eval.sh`` runs again with its output in
   ``swebench.log`` (SWE-bench harness semantics, no protection), after the protected run so
   nothing of this unprotected run can reach the verdict.
8. ``oom-kills-end`` with the counter again.

Failures the artifact's code can cause are made visible: ``pids-max-start``
/ ``pids-max-end`` carry the pids cgroup's ``max`` event counter (v2 ``pids.events``, v1
``pids/pids.events``: how often a fork was refused at the pids limit) and a watcher forked
before the tests prints ``pids-max-hit N`` the moment it rises (so a fork flood that holds
every pid until the deadline still shows); the eval script's output (stdout and stderr
together) passes through ``head -c`` of the limit in ``output_limit`` and, past it, one
``output-over N`` line is printed and the rest is drained unread. Markers and timestamps
after ``test-start`` use shell builtins only (``$EPOCHREALTIME``, ``read``): they still print
when no process can be forked. A test can print such lines itself, but they only ever claim a
failure, never a pass. The whole script is one function, parsed before it runs, so code of
the artifact that rewrites ``trial.sh`` cannot change what the script does next.

Exit codes: 0 (eval script ran to its end), 93 (the trial's inputs could not be unpacked, before
this script; :mod:`sandbox.trials.archive`), 94 (the base branch could not be checked out),
95 / 97 (apply failed), 96 (protection could not be applied: infra), 98 (no workdir).
"""

from __future__ import annotations

APPLY_FAILED_EXIT = 97
"""Exit code of the trial script when no method could apply the artifact."""
APPLY_UNEXPECTED_EXIT = 95
"""Exit code when applying changed a path the artifact does not name."""
PROTECT_FAILED_EXIT = 96
"""Exit code when the protected set could not be stashed or restored."""
UNPACK_FAILED_EXIT = 93
"""Exit code of a container whose trial inputs could not be unpacked (before the trial script:
no ``tar`` in the image, a full disk; :mod:`sandbox.trials.archive`)."""
CHECKOUT_FAILED_EXIT = 94
"""Exit code when the task's base branch (``checkout``) is not in the image's repository or
could not be checked out."""

TRIAL_SCRIPT = r"""#!/bin/bash
set -u
main() {
ED="${ECREDIT_DIR:-/ecredit}"
WD="${ECREDIT_WORKDIR:-/testbed}"
P="$ED/artifact.patch"
cd "$WD" || { echo "ecredit: no workdir"; exit 98; }
oom_kills() {
  local f k v
  if [ "${ECREDIT_OOM_COUNTER:-on}" = off ]; then echo na; return; fi
  for f in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control; do
    if [ -r "$f" ]; then
      while read -r k v; do
        if [ "$k" = oom_kill ]; then echo "$v"; return; fi
      done < "$f"
    fi
  done
  echo na
}
exists() { [ -e "$1" ] || [ -L "$1" ]; }
same() {  # same file state (absent / symlink target / bytes + mode) at $1 and $2
  if ! exists "$1" || ! exists "$2"; then ! exists "$1" && ! exists "$2"; return; fi
  if [ -L "$1" ] || [ -L "$2" ]; then
    [ -L "$1" ] && [ -L "$2" ] && [ "$(readlink -- "$1")" = "$(readlink -- "$2")" ]; return
  fi
  if [ -d "$1" ] || [ -d "$2" ]; then [ -d "$1" ] && [ -d "$2" ]; return; fi
  cmp -s -- "$1" "$2" && [ "$(stat -c %a -- "$1")" = "$(stat -c %a -- "$2")" ]
}
pids_max() {  # PM = the pids cgroup's "max" counter, without forking (works at the limit)
  local f k v
  PM=na
  [ "${ECREDIT_OOM_COUNTER:-on}" = off ] && return  # no cgroup of its own (local runtime)
  for f in /sys/fs/cgroup/pids.events /sys/fs/cgroup/pids/pids.events; do
    if [ -r "$f" ]; then
      while read -r k v; do
        if [ "$k" = max ]; then PM="$v"; return; fi
      done < "$f"
    fi
  done
}
now() { T="${EPOCHREALTIME:-}"; [ -n "$T" ] || T="$(date +%s.%N)"; }
echo ">>>>> ecredit oom-kills-start $(oom_kills)"
if [ -e "$ED/checkout" ]; then
  b="$(cat "$ED/checkout")"
  G=(git -c core.hooksPath=/dev/null -c advice.detachedHead=false)
  if "${G[@]}" rev-parse -q --verify "refs/heads/$b^{commit}" > /dev/null; then co=("$b")
  elif "${G[@]}" rev-parse -q --verify "refs/remotes/origin/$b^{commit}" > /dev/null; then
    co=(--no-track -b "$b" "refs/remotes/origin/$b")
  else
    echo ">>>>> ecredit checkout-failed no local branch $b in $WD (nor origin/$b)"; exit 94
  fi
  "${G[@]}" checkout -q "${co[@]}" -- || { echo ">>>>> ecredit checkout-failed git checkout $b"; exit 94; }
  echo ">>>>> ecredit checkout $b $("${G[@]}" rev-parse HEAD)"
fi
echo ">>>>> ecredit apply-start $(date +%s.%N)"
mkdir -p "$ED/base" "$ED/art" || exit 96
touch "$ED/stamp" || exit 96
while IFS= read -r -d '' p; do
  if exists "$p"; then cp -a --parents -- "$p" "$ED/base/" || exit 96; fi
done < "$ED/protected.list"
if [ -s "$P" ]; then
  if git apply --check "$P" > "$ED/check.log" 2>&1; then
    how="git apply --verbose"
    git apply --verbose "$P" || { echo ">>>>> Patch Apply Failed"; exit 97; }
  elif patch --dry-run --batch --forward --fuzz=5 -p1 -i "$P" >> "$ED/check.log" 2>&1; then
    how="patch --batch --forward --fuzz=5 -p1"
    patch --batch --forward --fuzz=5 -p1 --no-backup-if-mismatch -i "$P" \
      || { echo ">>>>> Patch Apply Failed"; exit 97; }
  else
    cat "$ED/check.log"; echo ">>>>> Patch Apply Failed"; exit 97
  fi
  declare -A named=()
  while IFS= read -r -d '' p; do named["./$p"]=1; done < "$ED/paths.list"
  odd=0
  while IFS= read -r -d '' f; do
    [ -n "${named["$f"]:-}" ] && continue
    case "$f" in *.rej|*.orig) rm -f -- "$f"; continue;; esac
    echo "ecredit: applying changed a path the artifact does not name: $f"; odd=1
  done < <(find . -path ./.git -prune -o ! -type d -cnewer "$ED/stamp" -print0)
  if [ "$odd" = 1 ]; then echo ">>>>> Patch Apply Failed"; exit 95; fi
  echo ">>>>> Applied Patch ($how)"
else
  echo ">>>>> Applied Patch (empty artifact)"
fi
touched=0
while IFS= read -r -d '' p; do
  if ! same "$ED/base/$p" "$p"; then
    touched=1
    echo ">>>>> ecredit protected-touched $(printf '%s' "$p" | base64 -w0)"
  fi
  if exists "$p"; then cp -a --parents -- "$p" "$ED/art/" || exit 96; fi
  rm -rf -- "$p" || exit 96
  if exists "$ED/base/$p"; then (cd "$ED/base" && cp -a --parents -- "$p" "$WD/") || exit 96; fi
done < "$ED/protected.list"
LIM="$(cat "$ED/output_limit" 2>/dev/null)"
case "$LIM" in ''|*[!0-9]*) LIM=67108864;; esac
pids_max; P0="$PM"
echo ">>>>> ecredit pids-max-start $P0"
W=""
if [ "$P0" != na ]; then
  mkfifo "$ED/tick" 2>/dev/null
  (exec 8<>"$ED/tick" || exit 0
   while :; do read -r -t 0.5 -u 8 _; pids_max
     if [ "$PM" != "$P0" ]; then echo ">>>>> ecredit pids-max-hit $PM"; exit 0; fi; done) &
  W=$!
fi
now; echo ">>>>> ecredit test-start $T"
bash "$ED/eval.sh" 2>&1 | {
  head -c "$LIM"
  if IFS= read -r -d '' -n 1 _; then echo; echo ">>>>> ecredit output-over $LIM"; cat > /dev/null; fi
}
rc=${PIPESTATUS[0]}
[ -n "$W" ] && kill "$W" 2>/dev/null
now; echo ">>>>> ecredit test-end $T $rc"
pids_max; echo ">>>>> ecredit pids-max-end $PM"
if [ -e "$ED/swebench.pass" ] && [ "$touched" = 1 ]; then
  while IFS= read -r -d '' p; do
    rm -rf -- "$p"
    if exists "$ED/art/$p"; then (cd "$ED/art" && cp -a --parents -- "$p" "$WD/"); fi
  done < "$ED/protected.list"
  echo ">>>>> ecredit swebench-pass"
  bash "$ED/eval.sh" 2>&1 | head -c "$LIM" > "$ED/swebench.log"
fi
echo ">>>>> ecredit oom-kills-end $(oom_kills)"
exit 0
}
main "$@"
exit
"""

__all__ = ["APPLY_FAILED_EXIT", "APPLY_UNEXPECTED_EXIT", "CHECKOUT_FAILED_EXIT", "PROTECT_FAILED_EXIT", "TRIAL_SCRIPT",
           "UNPACK_FAILED_EXIT"]
