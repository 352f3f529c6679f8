"""The package beside googleapis-common-protos, which owns the top-level google.rpc."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

import turnstile_client as ts
from google.protobuf import descriptor_pb2

# A stand-in for googleapis-common-protos: google.rpc's modules, registering
# google/rpc/*.proto as its releases do, with file options that differ from
# the copy turnstile_client carries (upstream's status.proto sets
# cc_enable_arenas), so the default descriptor pool cannot hold both.
MODULE = '''\
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf.internal import builder as _builder
{imports}
DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile({serialized!r})
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, globals())
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, "google.rpc.{name}", globals())
'''


def common_protos(root: Path) -> None:
    """Writes the stand-in's google/rpc under root."""
    from turnstile_client._rpc import error_details_pb2, status_pb2

    rpc = root / "google" / "rpc"
    rpc.mkdir(parents=True)
    (rpc / "__init__.py").write_text("")
    for name, mod, imports in [
        ("status_pb2", status_pb2, "from google.protobuf import any_pb2"),
        ("error_details_pb2", error_details_pb2, "from google.protobuf import duration_pb2"),
    ]:
        fd = descriptor_pb2.FileDescriptorProto()
        mod.DESCRIPTOR.CopyToProto(fd)
        fd.options.cc_enable_arenas = True
        (rpc / f"{name}.py").write_text(MODULE.format(imports=imports, serialized=fd.SerializeToString(), name=name))


class CommonProtosTest(unittest.TestCase):
    def run_python(self, code: str) -> subprocess.CompletedProcess:
        tmp = tempfile.TemporaryDirectory(prefix="turnstile-py-common-protos-")
        self.addCleanup(tmp.cleanup)
        common_protos(Path(tmp.name))
        # The stand-in first on the path; turnstile_client where this process finds it.
        path = [tmp.name, str(Path(ts.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=60)

    def test_two_google_rpc_in_one_pool_fail_to_import(self) -> None:
        # Why turnstile_client.rpc picks one: the copy beside the stand-in breaks.
        p = self.run_python("import google.rpc.status_pb2\nimport turnstile_client._rpc.status_pb2\n")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("google/rpc/status.proto", p.stderr)

    def test_the_client_uses_common_protos_when_installed_in_either_import_order(self) -> None:
        check = """
            from turnstile_client.rpc import status_pb2, error_details_pb2
            import google.rpc.status_pb2, google.rpc.error_details_pb2
            assert status_pb2 is google.rpc.status_pb2, status_pb2
            assert error_details_pb2 is google.rpc.error_details_pb2
            import grpc
            from google.protobuf import any_pb2
            from turnstile_client._errors import from_status
            info = any_pb2.Any()
            info.Pack(error_details_pb2.ErrorInfo(reason="RATE_LIMITED", domain="turnstile"))
            st = status_pb2.Status(code=8, message="slow down", details=[info])
            err = grpc.aio.AioRpcError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(),
                grpc.aio.Metadata(("grpc-status-details-bin", st.SerializeToString())), "slow down")
            print(ts.code_name(from_status(err).err.code))
        """
        for first in ("import turnstile_client as ts", "import google.rpc.status_pb2\nimport turnstile_client as ts"):
            with self.subTest(first=first):
                p = self.run_python(first + "\n" + textwrap.dedent(check))
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual(p.stdout, "RATE_LIMITED\n")

    def test_without_common_protos_the_package_uses_its_own_copy(self) -> None:
        # This process (Debian's packages, no googleapis-common-protos).
        try:
            import google.rpc.status_pb2  # noqa: F401
        except ImportError:
            self.assertEqual(ts.rpc.status_pb2.__name__, "turnstile_client._rpc.status_pb2")
        else:
            self.skipTest("googleapis-common-protos (or gen/python) is importable here")


class LayoutTest(unittest.TestCase):
    def test_the_package_is_typed_and_owns_no_other_top_level_name(self) -> None:
        root = Path(ts.__file__).parent
        self.assertTrue((root / "py.typed").is_file())
        self.assertTrue((root / "v1" / "agent_pb2.pyi").is_file())
        self.assertEqual(ts.v1.agent_pb2.RunTurnRequest.__module__, "turnstile_client.v1.agent_pb2")


if __name__ == "__main__":
    unittest.main()
