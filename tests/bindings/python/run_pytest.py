"""pytest for meson: the exit status is pytest's (5, "no tests collected", fails the meson
test), except that a run in which every test was skipped exits 77, meson's SKIP, so a suite that
cannot run here shows as skipped rather than passed."""
import sys

import pytest


class Outcomes:
    def __init__(self):
        self.passed = self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.skipped:
            self.skipped += 1


def main(argv):
    outcomes = Outcomes()
    status = pytest.main(argv, plugins=[outcomes])
    if status == 0 and outcomes.passed == 0 and outcomes.skipped > 0:
        return 77
    return int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
