"""``python -m tflms`` and the ``tflms`` console script; see `tflms.cli`."""

import sys

from tflms.cli import main

if __name__ == "__main__":
    sys.exit(main())
