"""A network link of a given rate in front of one TCP port on 127.0.0.1, for benchmarks whose
real bound on a cluster is the network (a restore from an object store), not the CPU that a
local server shares with the client on this small machine.

Two HTB classes on `lo`'s egress, one per direction (a full-duplex link): packets from the port
(the server's replies: downloads) and packets to it (requests, uploads), each at `rate`. Other
traffic on `lo` is not classified and goes unshaped (HTB's direct queue), so the server's own
traffic (radosgw to its OSD) runs at memory speed. Needs root and sch_htb.
"""
import subprocess
from urllib.parse import urlparse


def _tc(*args, check=True):
    return subprocess.run(["tc", *args], check=check, capture_output=True, text=True)


class Link:
    """`with Link("1600mbit", port):` shapes the port's traffic for the block; `rate` as tc
    takes it ("1600mbit", "10gbit")."""

    def __init__(self, rate, port, dev="lo"):
        self.rate, self.port, self.dev = rate, int(port), dev

    @staticmethod
    def port_of(url):
        u = urlparse(url)
        return u.port or (443 if u.scheme == "https" else 80)

    def __enter__(self):
        _tc("qdisc", "del", "dev", self.dev, "root", check=False)
        _tc("qdisc", "add", "dev", self.dev, "root", "handle", "1:", "htb")  # default: direct
        # A burst of a few of lo's 64 KiB segments, so that one segment does not stall the class.
        for minor in (10, 20):
            _tc("class", "add", "dev", self.dev, "parent", "1:", "classid", f"1:{minor}", "htb",
                "rate", self.rate, "ceil", self.rate, "burst", "256k", "cburst", "256k")
        for minor, field in ((10, "sport"), (20, "dport")):
            _tc("filter", "add", "dev", self.dev, "parent", "1:", "protocol", "ip", "prio", "1",
                "u32", "match", "ip", field, str(self.port), "0xffff", "flowid", f"1:{minor}")
        return self

    def bytes_sent(self):
        """Bytes through the two classes so far: (from the port, to the port)."""
        out = _tc("-s", "class", "show", "dev", self.dev).stdout
        sent, cls = {}, None
        for line in out.splitlines():
            words = line.split()
            if line.startswith("class htb"):
                cls = words[2]
            elif words[:1] == ["Sent"] and cls:
                sent[cls] = int(words[1])
        return sent.get("1:10", 0), sent.get("1:20", 0)

    def __exit__(self, *exc):
        _tc("qdisc", "del", "dev", self.dev, "root", check=False)
        return False

    def describe(self):
        return (f"port {self.port} behind {self.rate} each way (tc htb on {self.dev}; other "
                f"traffic unshaped)")
