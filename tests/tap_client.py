"""TAP lines from the Python test clients (tests/*-client.py): numbered from
`first`, so a shell test can run several clients under one plan."""

import sys
import traceback


class Tap:
    def __init__(self, first):
        self.n = first - 1
        self.failed = 0

    def ok(self, cond, desc, why=""):
        self.n += 1
        print(f"{'ok' if cond else 'not ok'} {self.n} - {desc}")
        if not cond:
            self.failed += 1
            if why:
                self.diag(why)
        sys.stdout.flush()
        return cond

    def diag(self, text):
        for line in str(text).splitlines():
            print(f"# {line}")
        sys.stdout.flush()

    def error(self, desc):
        """A check whose calls raised: not ok, with the traceback."""
        self.ok(False, desc)
        self.diag(traceback.format_exc())
