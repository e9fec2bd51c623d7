"""Main job: ``accelerate launch ecredit_trl/train.py --arm {O,B,M,E}``.

The trainer lands with the "trainer" issue; until then this entry point says so.
"""

import sys


def main(argv=None) -> int:
    print("ecredit-trl: the trainer (accelerate launch ecredit_trl/train.py --arm B) "
          "is not implemented yet; see the open issue 'The trainer and the main job'.",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
