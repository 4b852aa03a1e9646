"""What one conformance run is asked to check: the device, the number of ranks, the policies, quick or full.

The pytest options (registered by ``conformance_tests/conftest.py``) and the ``torchrec-ascend conformance`` flags
map one to one onto :class:`SuiteConfig`; the checks read nothing else.

Example::

    suite = SuiteConfig(device="cpu", world_size=2, quick=True)
    suite.profile.collective_backend   # 'gloo'
    suite.absent_reason()              # '' : the device is here
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from torchrec_ascend.conformance_tests.cases import Case
from torchrec_ascend.conformance_tests.launch import DEVICE_ENV, LaunchError, ran_on, run_distributed, script_env
from torchrec_ascend.errors import BackendError, ConfigError

#: The checks, in the order they run: check ``x`` is the module ``test_x.py`` of this package.
CHECKS = ("injection", "sharding", "hash_tables", "key_value", "pipeline", "checkpoint", "policies", "errors")
#: pytest option -> (CLI flag, default, help); the CLI passes each flag on as its option.
OPTIONS = {
    "--conformance-device": ("--device", "cpu", "torch device type to check (a backend profile's device_type)"),
    "--conformance-world-size": ("--world-size", 2, "ranks of the multi-process checks"),
    "--conformance-policy": ("--policy", (), "check this policy (NAME or NAME=JSON-options); repeatable; "
                                            "default: every installed policy"),
    "--conformance-quick": ("--quick", False, "fewer cases and steps, one case per area"),
    "--conformance-emulate": ("--emulate", False, "run on torchrec_ascend.testing's emulated NPU (with --device "
                                                  "npu; refused where torch_npu is installed)"),
    "--conformance-emulate-memory": ("--emulate-memory", 0, "device memory of each emulated npu in bytes, with "
                                                            "--emulate; 0: the npu profile's HBM"),
    "--conformance-case": ("--case", (), "run only the case with this id, the part in brackets of its test name "
                                         "(test_case[ID]); repeatable; default: every case of the checks run"),
}
#: Metavariables of the repeatable options.
METAVARS = {"--policy": "NAME[=JSON]", "--case": "ID"}
#: The device the emulator presents (``--emulate``).
EMULATED_DEVICE = "npu"


def add_options(add: Callable[..., Any], cli: bool) -> None:
    """Declare the settings of :data:`OPTIONS` with ``add``: pytest's ``addoption`` or argparse's ``add_argument``.

    Args:
        add: the declaring function (both take argparse's keywords).
        cli: declare the CLI flags (``--device``...) rather than the pytest options (``--conformance-device``...).
    """
    for option, (flag, default, help_text) in OPTIONS.items():
        name = flag if cli else option
        if isinstance(default, bool):
            add(name, action="store_true", default=False, help=help_text)
        elif isinstance(default, tuple):
            add(name, action="append", default=[], metavar=METAVARS[flag], help=help_text)
        else:
            add(name, type=type(default), default=default, help=f"{help_text} (default {default})")


@dataclasses.dataclass(frozen=True)
class SuiteConfig:
    """One conformance run's settings.

    Attributes:
        device (str): ``torch.device`` type under test; its backend profile decides the cases.
        world_size (int): ranks of the multi-process checks (the error checks always use one).
        policies (Tuple[str, ...]): ``NAME`` or ``NAME=JSON`` policies to check; empty: every installed policy.
        quick (bool): fewer cases and steps, keeping at least one case per area.
        emulate (bool): run on ``torchrec_ascend.testing``'s emulated NPU instead of Ascend hardware.
        emulate_memory (int): bytes of device memory per emulated npu (``--emulate`` only; 0: the npu profile's
            HBM, the emulator's default); an allocation past it fails the case with the OOM torch_npu raises.
        cases (Tuple[str, ...]): run only the cases with these ids (:attr:`Case.id`); empty: every case. The
            suite's pytest plugin refuses an id no collected test carries.

    Raises:
        ConfigError: ``world_size`` below 1, a malformed policy spec, ``emulate`` with a device other than ``npu``,
            or ``emulate`` where torch_npu is installed (the emulator and the real device cannot share a process);
            ``emulate_memory`` without ``emulate`` or below 0.
        BackendError: (from :attr:`profile`) no backend profile declares ``device``.

    Example::

        SuiteConfig(device="npu").absent_reason()   # 'no npu device here (...)' on this machine
    """

    device: str = "cpu"
    world_size: int = 2
    policies: Tuple[str, ...] = ()
    quick: bool = False
    emulate: bool = False
    emulate_memory: int = 0
    cases: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"--world-size must be at least 1, got {self.world_size}")
        if self.emulate_memory and not self.emulate:
            raise ConfigError(
                f"--emulate-memory {self.emulate_memory} sets the emulated npu's device memory: add --emulate "
                f"(--device {EMULATED_DEVICE} --emulate --emulate-memory BYTES), or drop it; real devices have "
                "their own memory"
            )
        if self.emulate_memory < 0:
            raise ConfigError(f"--emulate-memory must be a number of bytes >= 0 (0: the npu profile's HBM), "
                              f"got {self.emulate_memory}")
        if self.emulate and self.device != EMULATED_DEVICE:
            raise ConfigError(
                f"--emulate emulates the {EMULATED_DEVICE} device only, got --device {self.device}: use "
                f"--device {EMULATED_DEVICE} --emulate, or drop --emulate to check {self.device} itself"
            )
        if self.emulate and importlib.util.find_spec("torch_npu") is not None:
            raise ConfigError(
                "--emulate refuses to run where torch_npu is installed: the emulator would take the npu device "
                "type torch_npu registers. Check the real device with --device npu (no --emulate), or run the "
                "emulated suite in an environment without torch_npu"
            )
        for spec in self.policies:
            parse_policy(spec)

    @classmethod
    def from_pytest(cls, config: Any) -> "SuiteConfig":
        """The settings given as pytest options (see :data:`OPTIONS`; their defaults when not registered)."""
        value = {
            option[2:].replace("-", "_"): config.getoption(option[2:].replace("-", "_"), default)
            for option, (_, default, _) in OPTIONS.items()
        }
        return cls(
            device=value["conformance_device"],
            world_size=value["conformance_world_size"],
            policies=tuple(value["conformance_policy"] or ()),
            quick=value["conformance_quick"],
            emulate=value["conformance_emulate"],
            emulate_memory=value["conformance_emulate_memory"],
            cases=tuple(value["conformance_case"] or ()),
        )

    @functools.cached_property
    def profile(self) -> Any:
        """The backend profile of :attr:`device` (``torchrec_ascend.backends.DeviceProfile``)."""
        from torchrec_ascend import backends

        profile = backends.profile_for(self.device)
        if profile is None:
            known = sorted({p.device_type for p in backends.profiles().values()})
            close = difflib.get_close_matches(self.device, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise BackendError(
                f"no device backend declares the device type {self.device!r}; known device types: "
                f"{', '.join(known)}.{hint} Install the backend's plugin or pick one of these."
            )
        return profile

    @property
    def device_name(self) -> str:
        """The device as the summary names it: ``npu (emulated)`` under ``--emulate``, else :attr:`device`."""
        return f"{self.device} (emulated)" if self.emulate else self.device

    def absent_reason(self) -> str:
        """Why the device-bound checks cannot run here (``""`` when the device is present or emulated)."""
        if self.emulate or self.profile.detect():
            return ""
        hint = f"; get it with pip install {self.profile.installed_with}" if self.profile.installed_with else ""
        if self.device == EMULATED_DEVICE:
            hint += f", or check the NPU path without hardware on the emulated NPU: --device {self.device} --emulate"
        return f"no {self.device} device here ({self.profile.description}){hint}"

    def run_script(self, script: Path, cases: List[Case], world_size: Optional[int] = None,
                   timeout: float = 600.0) -> "ScriptRun":
        """Launch ``script`` once on the device for every runnable case.

        Args:
            script: a multi-process script taking ``--cases`` and ``--out`` (see ``launch.py``).
            cases: the check's cases; skipped ones and those :attr:`cases` leaves out are not sent.
            world_size: ranks; default :attr:`world_size`.
            timeout: seconds before the launch counts as hung.

        Returns:
            ScriptRun: the run's ``info`` and its results by case id.

        Raises:
            LaunchError: the launch failed, hung, wrote no results, returned a different number of results, or ran
                on another device than :attr:`device` (a script that does not read ``DEVICE_ENV`` yet).
        """
        runnable = [c for c in cases if not c.skip and (not self.cases or c.id in self.cases)]
        from torchrec_ascend import backends

        # The ranks select the backend under test (automatic selection would not pick the emulated npu).
        env = {**script_env(self.profile.device_type, self.profile.collective_backend, self.emulate,
                            self.emulate_memory),
               backends.DEVICE_ENV: self.profile.name}
        run = run_distributed(script, world_size or self.world_size, [c.params for c in runnable], env, timeout)
        if ran_on(run) != self.device:
            raise LaunchError(
                f"{script.name} ran on {ran_on(run)}, not {self.device}: it does not read {DEVICE_ENV} yet, so it "
                f"cannot check this device"
            )
        if len(run["results"]) != len(runnable):
            raise LaunchError(f"{script.name} returned {len(run['results'])} results for {len(runnable)} cases")
        return ScriptRun(run.get("info") or {}, {c.id: r for c, r in zip(runnable, run["results"])})


@dataclasses.dataclass(frozen=True)
class ScriptRun:
    """What a script launch returned.

    Attributes:
        info (Dict[str, Any]): rank 0's ``info`` (device, plugin state...).
        results (Dict[str, Dict[str, Any]]): case id -> the script's result for that case.
    """

    info: Dict[str, Any]
    results: Dict[str, Dict[str, Any]]


def parse_policy(spec: str) -> Tuple[str, Dict[str, Any]]:
    """Split a ``--policy`` value into the policy name and its options.

    Args:
        spec: ``NAME`` or ``NAME=JSON`` with a JSON object of options, e.g. ``ttl={"ttl_steps": 3}``.

    Raises:
        ConfigError: the options are not a JSON object.

    Example::

        parse_policy('ttl={"ttl_steps": 3}')   # ('ttl', {'ttl_steps': 3})
    """
    name, _, options = spec.partition("=")
    if not options:
        return name.strip(), {}
    try:
        parsed = json.loads(options)
    except json.JSONDecodeError as err:
        parsed, problem = None, str(err)
    else:
        problem = "" if isinstance(parsed, dict) else f"got a JSON {type(parsed).__name__}"
    if problem:
        raise ConfigError(
            f"--policy {spec!r}: the options after '=' must be a JSON object ({problem}), e.g. "
            f"--policy 'ttl={{\"ttl_steps\": 3}}'"
        )
    return name.strip(), parsed
