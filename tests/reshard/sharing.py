"""The sharing structure of a loaded checkpoint object, for comparing a view file with what the
framework writes.

Values alone do not show a view that trains wrongly: torch's optimizers update state tensors in
place (Adam's `step` += 1), so two places that load as one object step twice as fast. pickle keeps
object identity (its memo), and torch.save keeps storage identity (one record per storage), so a
view file and the framework's own file must agree on both:

* `objects(obj)`: every mutable object (tensor, dict, list, set, instance) reached a second time,
  as (path, path of its first place);
* `storages(obj)`: the tensors that stand on one storage, by the path of the first of them.

Paths follow the walk order (dict order, list order, then an instance's attributes), so two
objects of the same shape give the same paths. Immutable values (numbers, strings, None, dtypes,
torch.Size, enums) are not tracked: sharing them changes nothing. Tuples are walked but not tracked.
"""
import enum

import torch

_ATOMS = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device,
          torch.Size, type, enum.Enum, range, frozenset)


def _storage_key(t):
    """(address, bytes) of t's storage; None for an empty storage, which holds nothing to share."""
    s = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    n = s.nbytes() if hasattr(s, "nbytes") else s.size() * t.element_size()
    return (s.data_ptr(), n) if n else None


def _walk(obj):
    """Yields (path, object) for every place in obj, depth first, with the places inside an
    object reached before only once."""
    seen = set()
    stack = [("root", obj)]
    while stack:
        path, x = stack.pop()
        yield path, x
        if isinstance(x, _ATOMS) or isinstance(x, torch.Tensor):
            continue
        if id(x) in seen:
            continue
        seen.add(id(x))
        children = []
        if isinstance(x, dict):
            children += [(f"{path}[{k!r}]", v) for k, v in x.items()]
            meta = getattr(x, "_metadata", None)
            if meta is not None:
                children.append((f"{path}._metadata", meta))
        elif isinstance(x, (list, tuple)):
            children += [(f"{path}[{i}]", v) for i, v in enumerate(x)]
        elif isinstance(x, set):
            children += [(f"{path}{{{v!r}}}", v) for v in sorted(x, key=repr)]
        elif hasattr(x, "__dict__"):
            children += [(f"{path}.{k}", v) for k, v in vars(x).items()]
        stack.extend(reversed(children))


def objects(obj):
    first, out = {}, []
    for path, x in _walk(obj):
        if isinstance(x, _ATOMS) or isinstance(x, tuple):
            continue
        if id(x) in first:
            out.append((path, first[id(x)]))
        else:
            first[id(x)] = path
    return out


def storages(obj):
    """{path of the first tensor on a storage: [paths of the later tensors on it]}, for the
    storages more than one tensor object stands on."""
    first, tensors, out = {}, set(), {}
    for path, x in _walk(obj):
        if not isinstance(x, torch.Tensor) or id(x) in tensors:
            continue
        tensors.add(id(x))
        key = _storage_key(x)
        if key is None:
            continue
        if key in first:
            out.setdefault(first[key], []).append(path)
        else:
            first[key] = path
    return out


def _assert_storages_within(fewer, more, where, what):
    """Every storage that tensors of `fewer` share, the same tensors share in `more`."""
    apart = {}
    for head, rest in storages(more).items():
        for p in [head] + rest:
            apart[p] = head
    for head, rest in storages(fewer).items():
        for p in rest:
            assert head in apart and apart.get(p) == apart[head], \
                f"{where}: {p} shares the storage of {head} in {what}"


def assert_same_sharing(got, want, where, got_is_framework=False):
    """got (a loaded view file) shares exactly the objects want shares, and no storage that want
    does not share. want holds the sharing the framework writes: a file it wrote, loaded, or a
    reference built with that sharing. A view may give tensors storages of their own where the
    framework's are views of one buffer (DeepSpeed's module tensors): loading copies them
    either way, while a storage shared that the framework keeps apart is written through.
    got_is_framework: got is what the framework wrote and want a reference (the fixtures' own
    checks), so it is want that may share no more storage."""
    g, w = objects(got), objects(want)
    assert g == w, f"{where}: shared objects differ:\n  got: {g[:8]}\n  want: {w[:8]}"
    if got_is_framework:
        _assert_storages_within(want, got, where, "the reference, not in the framework's file")
    else:
        _assert_storages_within(got, want, where, "the view, not in the framework's file")
