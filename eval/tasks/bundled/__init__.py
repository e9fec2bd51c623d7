"""Bundled tasks: real PyPI projects with one injected bug per task (two in a pair task).

``python -m eval.build_tasks [--recipe datasets/bundled.yaml] [--out DIR] [--concurrency 2]
[--force] [--no-record] [--write-record]`` builds (or finds in the cache) the tasks of a recipe and prints a summary.

Pipeline:

1. **Sources.** Each project's sdist is fetched with ``pip download --no-deps --no-binary
   :all:`` (cached under ``$ECREDIT_CACHE/sdists``), its sha256 checked against the recipe,
   and unpacked (``__pycache__`` / ``*.pyc`` dropped) into a git repository whose single
   commit, the pristine tree, has fixed author/committer names and dates: its SHA depends
   only on the sdist.
2. **Candidates.** Every mutation site inside function bodies of the recipe's modules is
   listed (:func:`eval.tasks.bundled.mutations.find_mutations`: comparison / arithmetic / augmented-assignment /
   boolean operator swap, negated condition, off-by-one integer, flipped bool constant,
   ``return None`` instead of the value, dropped statement). Each is a minimal textual edit
   of one source line (formatting kept; files are never re-unparsed). The list is shuffled
   with ``random.Random(f"{seed}:{project}")``, interleaved by kind, one per source line,
   and checked to parse and to change the AST. Each screened candidate becomes a commit
   whose parent is the pristine commit (again with fixed metadata).
3. **Screening** (Podman, :class:`sandbox.trials.pool.VerifierPool`): the pristine tree runs all the
   recipe's test files twice (a test whose status differs between the two runs is flaky and
   never listed); a candidate runs the test files of its module. FAIL_TO_PASS =
   listed tests PASSED on pristine and FAILED/ERROR on the mutant; PASS_TO_PASS = PASSED on
   both. A candidate is kept when FAIL_TO_PASS is non-empty (at most ``max_fail_to_pass``)
   and every other listed test still passes. Tests whose parsed id is ambiguous (seen twice
   in the pristine log, or truncated by the parser: unbalanced ``[``) run but are not listed.
4. **Controls**: gold (the reverse patch) must resolve and the empty patch must not (every
   F2P test failing, every P2P test passing), both graded by :func:`eval.grading.grader.grade`;
   gold runs twice and a candidate whose listed tests differ between the two is dropped
   as flaky (:mod:`eval.grading.flaky`).
5. The first ``target_per_project`` validated candidates of each project (in candidate
   order, so batch sizes never change the result) become single tasks.
   **Pairs** (``multi_per_project`` > 0, :mod:`eval.tasks.bundled.multi`): the next
   ``2 * multi_per_project + multi_spare`` screened candidates are parts (screening only,
   no controls of their own), never tasks of their own; they are paired (another file
   first, else another function of the file), each pair becomes one commit with both
   mutations (id ``..-<i>-<j>``), is screened on both modules' test files (its
   FAIL_TO_PASS must hold a test broken by each part, so fixing one part does not resolve;
   that screening trial is also its empty control) and its gold patch runs twice; pairs
   are tried in pair order only until ``multi_per_project`` are kept, and those become
   tasks after the project's singles
   (``extra["blocks"]`` = 2, ``extra["mutations"]`` lists both). The problem statement is
   made from the failing tests' ids and their ``E`` assertion lines in the mutant's log,
   never from the gold patch.

**The screening record** (:mod:`.record`): the candidates the reference build rejected at
screening (``datasets/bundled.screening.json`` beside ``datasets/bundled.yaml``). A build takes
their recorded outcome instead of running their trials, so every round plans exactly as in the
build that wrote it and the tasks come out the same; the record only skips, never keeps, and a
record of another recipe hash is ignored. ``--no-record`` screens every candidate.

**Worlds.** A recipe with a ``heldout`` field (``datasets/procedural.yaml``) builds a world:
``target_per_project`` above the candidate count keeps every validated single mutation,
instance ids start with the recipe's ``id_prefix``, and each task records its unit of code
and split (``extra["unit"]``, ``extra["split"]``, :mod:`.world`); pairs are refused there.

Output ``DIR`` (default ``$ECREDIT_CACHE/bundled/<recipe hash>``, ``$ECREDIT_CACHE``
defaulting to ``~/.cache/ecredit-trl``): ``tasks.jsonl`` (byte-identical across rebuilds
of the same recipe), ``build.json`` (timings, per-candidate outcomes), ``repos/<project>``
(git repositories holding every task's ``base_commit``). The directory is written under a
temporary name and renamed when complete. Only the recipe and its screening record are
committed to this project.

Modules, one a pipeline step: :mod:`.recipe` (schema, cache key), :mod:`.sources` (step 1),
:mod:`.mutations` (step 2), :mod:`.screening` (steps 3 and 4), :mod:`.multi` (pairs),
:mod:`.scripts` (a task's eval script and problem statement), :mod:`.build` (orchestration),
:mod:`.record` (the screening record), :mod:`.cache` (the build cache, ``ensure_built``),
:mod:`.world` (a world's split), :mod:`.materialize` (candidate commits without tests, for
determinism checks), :mod:`.imagetasks` (stand-in image-held tasks).
"""

