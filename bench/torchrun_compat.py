#!/usr/bin/python3
"""Runs Debian's torchrun (torch 1.13) under Python 3.11, where it crashes at start.

torch 1.13's Std.from_str finds the enum member by iterating over Std, and under Python 3.11
iterating an IntFlag skips NONE (0) and the alias ALL (3), so the default "--redirects 0"
becomes None and torchrun fails with "'NoneType' object has no attribute 'get'".  This
wrapper replaces from_str with a lookup by value and then runs torchrun's own main().
Used by the benchmarks only, to compare against torchrun.
"""
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.fullmatch(r"[0-3]", vm):
        return cls(int(vm))
    if re.fullmatch(r"(\d:[0-3],)*\d:[0-3]", vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


api.Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main
    sys.exit(main())
