"""``python -m tflms`` and the ``tflms`` console script; see `tflms.cli`."""

import sys

from tflms import cli


def main():
    """The ``tflms`` program: `cli.main` for this process's own command
    line (TensorFlow is imported only once the arguments are parsed)."""
    return cli.main(program=True)


if __name__ == "__main__":
    sys.exit(main())
