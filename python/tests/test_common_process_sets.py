"""``kolo.common.process_sets`` is Horovod's ``horovod.common.process_sets`` path: the same
objects as :mod:`kolo.process_sets` (one global set, one registry), not copies."""

import kolo.process_sets
from kolo.common import process_sets


def test_horovod_common_path_re_exports_the_same_objects():
    for name in ("ProcessSet", "add_process_set", "global_process_set", "remove_process_set"):
        assert getattr(process_sets, name) is getattr(kolo.process_sets, name), name
    assert sorted(process_sets.__all__) == sorted(kolo.process_sets.__all__)
    assert process_sets.ProcessSet([1, 0]).ranks == [0, 1]
