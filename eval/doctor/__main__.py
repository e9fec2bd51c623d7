"""``python -m eval.doctor``: :func:`eval.doctor.cli.main` (what ``python -m sandbox doctor``
runs)."""

import sys

from eval.doctor.cli import main

sys.exit(main())
