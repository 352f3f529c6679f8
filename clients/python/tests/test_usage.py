"""A turn's usage summed over its attempts, costs included."""

from __future__ import annotations

import unittest

from turnstile_client._protocol import add_usage
from turnstile_client.v1 import conversation_pb2 as pb


def usd(units: int, nanos: int) -> pb.Cost:
    return pb.Cost(currency="USD", units=units, nanos=nanos)


class UsageTest(unittest.TestCase):
    def test_costs_add_up(self) -> None:
        priced = lambda units, nanos: pb.Usage(input_tokens=10, cost=usd(units, nanos))  # noqa: E731
        unpriced = pb.Usage(input_tokens=10)
        for name, adds, want in [
            ("carried", [priced(0, 600_000_000), priced(1, 700_000_000)], pb.Usage(input_tokens=20, cost=usd(2, 300_000_000))),
            ("unpriced after priced", [priced(0, 5), unpriced], pb.Usage(input_tokens=20, cost=usd(0, 5), cost_partial=True)),
            ("priced after unpriced", [unpriced, priced(0, 5)], pb.Usage(input_tokens=20, cost=usd(0, 5), cost_partial=True)),
            ("no price at all", [unpriced, unpriced, None], pb.Usage(input_tokens=20)),
            ("nothing used", [pb.Usage(), priced(0, 3)], pb.Usage(input_tokens=10, cost=usd(0, 3))),
        ]:
            got = pb.Usage()
            for u in adds:
                add_usage(got, u)
            self.assertEqual(got, want, name)
            self.assertEqual(got.HasField("cost"), want.HasField("cost"), name)


if __name__ == "__main__":
    unittest.main()
