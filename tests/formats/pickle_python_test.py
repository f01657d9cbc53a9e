"""The non-executing pickle reader and the writer, against CPython's own pickle.

Every case is pickled by Python with protocols 2-5, read by ckptfs's reader and written again by
ckptfs's writer with protocols 2-5 (tests/formats/pickle_roundtrip_tool.cc); Python must unpickle
the result to an object equal to the original, with the same sharing and cycles. A torch.save
file whose data.pkl went through the same round trip must still load in torch with equal tensors.

Run by ctest with Debian's /usr/bin/python3; PICKLE_TOOL names the tool binary.
"""
import argparse
import collections
import datetime
import decimal
import enum
import fractions
import io
import math
import os
import pickle
import subprocess
import zipfile

import pytest

TOOL = os.environ.get("PICKLE_TOOL", "")
PROTOCOLS = (2, 3, 4, 5)


def roundtrip(data, protocol):
    r = subprocess.run([TOOL, str(protocol)], input=data, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def debug(data):
    r = subprocess.run([TOOL, "--debug"], input=data, capture_output=True, timeout=60)
    return r.returncode, r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace")


class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __eq__(self, other):
        return type(other) is Point and (self.x, self.y) == (other.x, other.y)


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, other):
        return type(other) is Slotted and (self.a, self.b) == (other.a, other.b)


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Tagged(list):
    """A list subclass with attributes: APPENDS and BUILD on one object."""

    def __eq__(self, other):
        return list(self) == list(other) and vars(self) == vars(other)


def cases():
    tagged = Tagged([1, 2, 3])
    tagged.tag = "t"
    od = collections.OrderedDict([("b", 1), ("a", [1.5, None])])
    return {
        "scalars": [None, True, False, 0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31 - 1,
                    2**63 - 1, -2**63, 2**64, -2**100, 2**1000, 0.0, -0.0, 1.5, 1e308, -1e-308,
                    float("inf")],
        "text": ["", "a", "ünïcødé", "\u4e2d\u6587", "\U0001f600", "x" * 300, "line\nbreak",
                 "nul\0byte", "\ud800 lone surrogate"],
        "bytes": [b"", b"\x00\xff", bytes(range(256)) * 3, bytearray(b"abc"), bytearray()],
        "containers": [(), (1,), (1, 2), (1, 2, 3), tuple(range(10)), [], [[]], {}, {"k": {}},
                       {1: "a", (2, 3): [4]}, set(), {1, 2, 3}, frozenset(), frozenset({"x"})],
        "objects": [argparse.Namespace(lr=0.1, name="run", layers=[1, 2]), od, Point(1, [2]),
                    Slotted(1, "b"), Color.GREEN, complex(1, -2), datetime.date(2026, 11, 23),
                    datetime.datetime(2026, 11, 23, 4, 5, 6, 7), decimal.Decimal("1.25"),
                    fractions.Fraction(3, 7), collections.defaultdict(list, {"a": [1]}),
                    collections.Counter("hello"), tagged, range(1, 10, 2), slice(1, 5)],
        "deep": [[[[[[[[[["deep"]]]]]]]]]],
    }


@pytest.mark.parametrize("in_proto", PROTOCOLS)
@pytest.mark.parametrize("out_proto", PROTOCOLS)
@pytest.mark.parametrize("name", sorted(cases()))
def test_round_trip_is_equal(name, in_proto, out_proto):
    obj = cases()[name]
    back = pickle.loads(roundtrip(pickle.dumps(obj, protocol=in_proto), out_proto))
    if name == "scalars":  # -0.0 == 0.0: compare the sign too
        assert [math.copysign(1, v) if isinstance(v, float) else v for v in back] == \
               [math.copysign(1, v) if isinstance(v, float) else v for v in obj]
    assert back == obj
    assert [type(v) for v in back] == [type(v) for v in obj]


@pytest.mark.parametrize("in_proto", PROTOCOLS)
@pytest.mark.parametrize("out_proto", PROTOCOLS)
def test_sharing_and_cycles_survive(in_proto, out_proto):
    shared = [1, 2]
    cyc = []
    cyc.append(cyc)
    d = {}
    d["self"] = d
    p = Point(0, 0)
    p.y = p
    obj = {"a": shared, "b": shared, "t": (shared, shared), "cyc": cyc, "d": d, "p": p}
    back = pickle.loads(roundtrip(pickle.dumps(obj, protocol=in_proto), out_proto))
    assert back["a"] == [1, 2] and back["a"] is back["b"]
    assert back["t"][0] is back["a"] and back["t"][1] is back["a"]
    assert back["cyc"][0] is back["cyc"]
    assert back["d"]["self"] is back["d"]
    assert back["p"].y is back["p"]


def test_protocol_0_and_1_input_is_read():
    obj = {"a": [1, 2.5, "s", None, True], "p": Point(1, 2), "t": (1,)}
    for in_proto in (0, 1):
        back = pickle.loads(roundtrip(pickle.dumps(obj, protocol=in_proto), 2))
        assert back == obj


def test_torch_state_dict_survives_the_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(7)
    sd = {
        "w": torch.randn(4, 8, generator=g),
        "view": None,
        "bf16": torch.randn(16, generator=g).to(torch.bfloat16),
        "i64": torch.arange(10),
        "param": torch.nn.Parameter(torch.ones(3)),
        "args": argparse.Namespace(tp=2, pp=1),
        "step": 100,
    }
    sd["view"] = sd["w"][1:3, ::2]  # a strided view sharing w's storage
    src = tmp_path / "src.pt"
    torch.save(sd, src)
    dst = tmp_path / "dst.pt"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith("/data.pkl"):
                data = roundtrip(data, 2)
            zout.writestr(item, data)
    back = torch.load(dst)
    assert set(back) == set(sd)
    for k in ("w", "bf16", "i64", "param", "view"):
        assert back[k].dtype == sd[k].dtype and torch.equal(back[k], sd[k]), k
    assert back["view"].stride() == sd["view"].stride()
    assert back["view"].storage().data_ptr() == back["w"].storage().data_ptr()
    assert isinstance(back["param"], torch.nn.Parameter)
    assert back["args"] == sd["args"] and back["step"] == 100


class Evil:
    def __reduce__(self):
        return (os.system, ("touch " + EVIL_MARK,))


EVIL_MARK = "/tmp/ckptfs-pickle-test-was-executed"


def test_malicious_pickle_is_data_not_code():
    if os.path.exists(EVIL_MARK):
        os.unlink(EVIL_MARK)
    data = pickle.dumps({"model": [1, 2], "payload": Evil()}, protocol=2)
    rc, out, err = debug(data)
    assert rc == 0, err
    assert "posix.system" in out or "os.system" in out
    assert "touch " + EVIL_MARK in out
    # Written back, it is the same call, still inert until someone unpickles it.
    again = roundtrip(data, 2)
    rc, out2, _ = debug(again)
    assert rc == 0 and out2 == out
    assert not os.path.exists(EVIL_MARK)


@pytest.mark.parametrize("cut", [1, 2, 5, 17, -1])
def test_truncated_pickles_are_refused_with_a_reason(cut):
    data = pickle.dumps({"a": list(range(50)), "b": "x" * 40}, protocol=4)
    rc, _, err = debug(data[:cut] if cut > 0 else data[:-1])
    assert rc == 1
    assert "orrupt" in err and ("truncated" in err or "end" in err), err


def test_garbage_is_refused_with_a_reason():
    for bad in (b"\x80\x02\xff.", b"\x80\x02a.", b"\x80\x02h\x05.", b"\x80\x021."):
        rc, _, err = debug(bad)
        assert rc == 1 and "orrupt" in err, (bad, err)
