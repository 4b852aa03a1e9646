"""``torchrec-ascend conformance`` flags map onto the suite's pytest options; bad settings stop it with the reason.

Also the launcher's device environment (what scripts read to place ranks) and the check that refuses results from
a script that ran on another device than the one under test.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from torchrec_ascend.cli import conformance as cli
from torchrec_ascend.cli import main as cli_main
from torchrec_ascend.conformance_tests import launch
from torchrec_ascend.conformance_tests.cases import Case
from torchrec_ascend.conformance_tests.config import SuiteConfig, parse_policy
from torchrec_ascend.errors import BackendError, ConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers())
    return parser.parse_args(["conformance", *argv])


def test_flags_become_the_suite_options() -> None:
    args = parse("--device", "npu", "--world-size", "8", "--policy", "lru", "--policy", 'ttl={"ttl_steps": 3}',
                 "--quick", "--only", "policies", "errors", "--junit", "out.xml")
    argv = cli.pytest_args(args)
    targets = argv[argv.index("--pyargs") + 1:argv.index("--pyargs") + 3]
    assert targets == [f"{cli.PACKAGE}.test_policies", f"{cli.PACKAGE}.test_errors"]
    for option in ("--conformance-device=npu", "--conformance-world-size=8", "--conformance-policy=lru",
                   '--conformance-policy=ttl={"ttl_steps": 3}', "--conformance-quick", "--junitxml=out.xml",
                   f"--rootdir={cli.PACKAGE_DIR}", "no:cacheprovider"):
        assert option in argv


def test_defaults_run_every_check_in_full() -> None:
    argv = cli.pytest_args(parse())
    assert argv[argv.index("--pyargs") + 1] == cli.PACKAGE
    assert "--conformance-device=cpu" in argv and "--conformance-world-size=2" in argv
    assert "--conformance-quick" not in argv and not any(a.startswith("--junitxml") for a in argv)


@pytest.mark.parametrize("argv, message", [
    (["--device", "npx"], "Did you mean 'npu'?"),
    (["--world-size", "0"], "--world-size must be at least 1"),
    (["--policy", "ttl={bad"], "must be a JSON object"),
])
def test_bad_settings_exit_2_with_the_reason(argv: list, message: str, capsys: Any) -> None:
    assert cli_main(["conformance", *argv]) == cli.USAGE_ERROR
    assert message in capsys.readouterr().err


def test_unknown_device_lists_the_known_device_types() -> None:
    with pytest.raises(BackendError, match="known device types: cpu, cuda, npu"):
        SuiteConfig(device="tpu").profile  # noqa: B018  (the property access is what raises)


def test_parse_policy() -> None:
    assert parse_policy("lru") == ("lru", {})
    assert parse_policy('ttl={"ttl_steps": 3}') == ("ttl", {"ttl_steps": 3})
    with pytest.raises(ConfigError, match="got a JSON list"):
        parse_policy("ttl=[1]")


def test_script_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(launch.DEVICE_ENV, raising=False)
    monkeypatch.delenv(launch.BACKEND_ENV, raising=False)
    assert (launch.process_group_backend(), str(launch.script_device())) == ("gloo", "cpu")
    for name, value in launch.script_env("cuda", "nccl").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert (launch.process_group_backend(), str(launch.script_device())) == ("nccl", "cuda:3")
    assert launch.ran_on({"info": {"device": "npu"}}) == "npu" and launch.ran_on({"info": {}}) == "cpu"


FAKE_SCRIPT = '''
import argparse, json
parser = argparse.ArgumentParser()
parser.add_argument("--cases")
parser.add_argument("--out")
args = parser.parse_args()
json.dump({"info": {}, "results": [{"error": ""} for _ in json.loads(args.cases)]}, open(args.out, "w"))
'''


def test_results_from_another_device_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "cpu_only.py"
    script.write_text(FAKE_SCRIPT)
    cpu = SuiteConfig().profile
    suite = SuiteConfig(device="npu")
    monkeypatch.setitem(suite.__dict__, "profile", cpu)  # pretend the npu were here, with the cpu's settings
    cases = [Case({"kind": "a"}), Case({"kind": "b"}, skip="not here")]
    assert SuiteConfig().run_script(script, cases, world_size=1).results == {"a": {"error": ""}}
    with pytest.raises(launch.LaunchError, match=f"ran on cpu, not npu: it does not read {launch.DEVICE_ENV}"):
        suite.run_script(script, cases, world_size=1)


def test_emulate_flag_reaches_the_suite_and_its_scripts() -> None:
    args = parse("--device", "npu", "--emulate")
    assert "--conformance-emulate" in cli.pytest_args(args) and "--conformance-emulate" not in cli.pytest_args(parse())
    suite = SuiteConfig(device="npu", emulate=True)
    assert suite.absent_reason() == "" and suite.device_name == "npu (emulated)"
    assert launch.script_env("npu", "gloo", emulate=True)[launch.EMULATE_ENV] == "1"
    assert launch.script_env("cpu", "gloo")[launch.EMULATE_ENV] == "0"


def test_emulate_memory_reaches_the_emulated_ranks() -> None:
    argv = cli.pytest_args(parse("--device", "npu", "--emulate", "--emulate-memory", "1048576"))
    assert "--conformance-emulate-memory=1048576" in argv
    env = launch.script_env("npu", "hccl", emulate=True, memory=1 << 20)
    assert env[launch.EMULATOR_MEMORY_ENV] == "1048576"
    assert launch.EMULATOR_MEMORY_ENV not in launch.script_env("npu", "hccl", emulate=False, memory=1 << 20)
    from torchrec_ascend.testing.emulated_npu import MEMORY_ENV

    assert launch.EMULATOR_MEMORY_ENV == MEMORY_ENV


@pytest.mark.parametrize("argv, message", [
    (["--emulate-memory", "1048576"], "--emulate-memory 1048576 sets the emulated npu's device memory: add --emulate"),
    (["--device", "npu", "--emulate", "--emulate-memory", "-1"], "--emulate-memory must be a number of bytes >= 0"),
    (["--emulate"], "--emulate emulates the npu device only, got --device cpu"),
    (["--device", "cuda", "--emulate"], "--emulate emulates the npu device only, got --device cuda"),
])
def test_emulate_with_another_device_is_refused(argv: list, message: str, capsys: Any) -> None:
    assert cli_main(["conformance", *argv]) == cli.USAGE_ERROR
    assert message in capsys.readouterr().err


def test_emulate_refuses_to_mix_with_torch_npu(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_npu" else real(name, *a))
    assert cli_main(["conformance", "--device", "npu", "--emulate"]) == cli.USAGE_ERROR
    err = capsys.readouterr().err
    assert "--emulate refuses to run where torch_npu is installed" in err and "--device npu (no --emulate)" in err


def test_real_npu_without_torch_npu_says_how_to_get_it(capsys: Any) -> None:
    from torchrec_ascend import backends

    if backends.profile_for("npu").detect():
        pytest.skip("torch_npu is installed here")
    assert cli_main(["conformance", "--device", "npu", "--quick"]) == cli.USAGE_ERROR
    err = capsys.readouterr().err
    assert "no npu device here" in err and "pip install torchrec-ascend[npu]" in err, err
    assert "--device npu --emulate" in err, err


def test_case_runs_only_the_named_cases(tmp_path: Path, capsys: Any) -> None:
    junit = tmp_path / "junit.xml"
    argv = ["conformance", "--only", "policies", "--policy", "lru", "--policy", "lfu", "--case", "lfu",
            "--junit", str(junit)]
    assert cli_main(argv) == 0, capsys.readouterr().out
    assert [case.get("name") for case in ET.parse(junit).iter("testcase")] == ["test_contract[lfu]"]
    assert cli.pytest_args(parse("--case", "a", "--case", "b"))[-2:] == ["--conformance-case=a",
                                                                         "--conformance-case=b"]


def test_an_unknown_case_exits_2_naming_the_ids_there(capsys: Any) -> None:
    argv = ["conformance", "--only", "policies", "--policy", "lru", "--case", "lfu"]
    assert cli_main(argv) == cli.USAGE_ERROR
    output = capsys.readouterr()
    assert "--case lfu: no case of the checks run has this id" in output.out + output.err
    assert "The ids here: lru" in output.out + output.err
