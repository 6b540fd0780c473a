"""zmuon.Muon through the generic checks of PyTorch's own optimizer suite: its
TestOptimRenewed, built on torch.testing._internal.common_optimizers (OptimizerInfo, @optims,
instantiate_device_type_tests). The test file is not in the torch wheel, so each check is written
here after the torch test it follows (named in its docstring). Each runs for zmuon.Muon (ZMUON,
an OptimizerInfo: its kwargs variants, no foreach/fused/differentiable implementations) and for
torch.optim.AdamW (REFERENCE): the assertions hold for torch's own optimizer, and where the
semantics agree the results are compared with it.

Where zmuon differs from torch.optim by design, the check says so and asserts zmuon's behaviour:
- a group mixing Muon and AdamW parameters needs use_muon / algorithm once there is more than one
  group (InvalidArgument naming it); an AdamW group's default lr is `adam_lr`, not `lr`;
- a parameter twice in a group is refused (DuplicateParameter, a ValueError; torch warns and drops
  the copy); named and unnamed tensors may be mixed (the unnamed get made-up names; torch
  refuses); a complex parameter is refused (TypeError naming its dtype).

Not run here, and why:
- test_foreach_matches_forloop, test_fused_matches_forloop, test_fused_*, test_mixed_device_dtype,
  test_peak_memory_foreach, test_defaults_changed_to_foreach,
  test_set_default_dtype_works_with_foreach, test_foreach_large_tensor, test_cpu_load_state_dict:
  zmuon has one implementation (supported_impls=()).
- test_complex, test_complex_2d: complex parameters are refused (checked here).
- test_rosenbrock_sparse: no sparse gradients. test_second_order_optims_return_consistent_types:
  zmuon's step needs no closure.
- test_forloop_goes_right_direction_multigpu: parameters on two GPUs are refused by name
  (tests/python/gpu_torch_device.py checks it on the GPU machine).
- test_state_dict_with_cuda_params (CUDA only) is written here but runs only where torch sees a
  GPU and expecttest is installed (not yet on the GPU machine); on the CPU a state_dict saved in
  float64 loads as torch casts it (test_state_dict_loads_cast_to_the_parameters).

Run by ctest with the venv's python (.venv, with expecttest for torch.testing._internal).
"""

import copy
import functools
import tempfile
import unittest

import torch
from torch.nn import Parameter
from torch.optim import SGD
from torch.optim.lr_scheduler import ReduceLROnPlateau
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)
from torch.testing._internal.common_device_type import instantiate_device_type_tests, onlyCUDA
from torch.testing._internal.common_optimizers import (
    ErrorOptimizerInput, OptimizerInfo, OptimizerInput, _get_optim_inputs_including_global_cliquey_kwargs,
    get_error_inputs_for_all_optims, optims)
from torch.testing._internal.common_utils import TestCase, parametrize

import zmuon

torch.set_num_threads(2)


class NamedInfo(OptimizerInfo):
    """An OptimizerInfo whose tests are named `label`, not the class name (zmuon's class is
    called Muon, as torch.optim's)."""

    def __init__(self, label, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.label = label

    @property
    def name(self):
        return self.label


def zmuon_inputs(device, dtype=None):
    """zmuon.Muon's kwargs variants: defaults, Muon's and AdamW's rates, decay, momentum."""
    return [
        OptimizerInput(params=None, kwargs={}, desc="defaults"),
        OptimizerInput(params=None, kwargs={"lr": 0.01, "adam_lr": 0.01}, desc="rates"),
        OptimizerInput(params=None, kwargs={"weight_decay": 0.1}, desc="weight decay"),
        OptimizerInput(params=None, kwargs={"momentum": 0.9, "nesterov": False},
                       desc="momentum without nesterov"),
        OptimizerInput(params=None, kwargs={"betas": (0.8, 0.99), "eps": 1e-8},
                       desc="AdamW's betas and eps"),
    ]


def adamw_inputs(device, dtype=None):
    return [
        OptimizerInput(params=None, kwargs={}, desc="defaults"),
        OptimizerInput(params=None, kwargs={"lr": 0.01, "weight_decay": 0.1}, desc="rate, decay"),
        OptimizerInput(params=None, kwargs={"amsgrad": True}, desc="amsgrad"),
    ]


def zmuon_error_inputs(device, dtype):
    """Bad hyperparameters: each refused at construction as torch.optim refuses them."""
    p = Parameter(torch.randn(3, 2, device=device, dtype=dtype))
    bad = [({"lr": -1.0}, "lr"), ({"weight_decay": -1.0}, "weight_decay"),
           ({"betas": (1.0, 0.999)}, r"betas\[0\]"), ({"eps": -1.0}, "eps"),
           ({"momentum": 1.5}, "momentum")]
    return [ErrorOptimizerInput(OptimizerInput(params=[p], kwargs=kw, desc=key),
                                error_type=ValueError, error_regex=key) for kw, key in bad]


def adamw_error_inputs(device, dtype):
    p = Parameter(torch.randn(3, 2, device=device, dtype=dtype))
    bad = [({"lr": -1.0}, "learning rate"), ({"weight_decay": -1.0}, "weight_decay"),
           ({"betas": (1.0, 0.999)}, "beta"), ({"eps": -1.0}, "epsilon")]
    return [ErrorOptimizerInput(OptimizerInput(params=[p], kwargs=kw, desc=key),
                                error_type=ValueError, error_regex=key) for kw, key in bad]


# The group keys a zmuon state_dict of an older zmuon may lack (load keeps the current values).
NEWER_KEYS = ("cautious_weight_decay", "variant", "normuon_beta2", "normuon_eps", "qk_clip_tau",
              "algorithm")

ZMUON = NamedInfo("zmuon", zmuon.Muon, optim_inputs_func=zmuon_inputs,
                  optim_error_inputs_func=zmuon_error_inputs, supported_impls=(),
                  not_og_supported_flags=NEWER_KEYS, supports_complex=False,
                  supports_multiple_devices=False)
REFERENCE = NamedInfo("torch_AdamW", torch.optim.AdamW, optim_inputs_func=adamw_inputs,
                      optim_error_inputs_func=adamw_error_inputs, supported_impls=())
BOTH = [ZMUON, REFERENCE]


def is_zmuon(optim_info):
    return optim_info.optim_cls is zmuon.Muon


def inputs(device, dtype, optim_info):
    return _get_optim_inputs_including_global_cliquey_kwargs(device, dtype, optim_info)


def one_tensor_optimizers(device, dtype, optim_info):
    """An optimizer over one [2, 3] tensor for each of `optim_info`'s kwargs variants: the hook
    tests' subject."""
    for optim_input in inputs(device, dtype, optim_info):
        yield optim_info.optim_cls([torch.rand(2, 3, device=device, dtype=dtype,
                                               requires_grad=True)], **optim_input.kwargs)


def one_algorithm(optim_info, group):
    """A group holding a matrix and a vector: zmuon needs its algorithm named once there is more
    than one group (torch.optim runs one algorithm anyway)."""
    return dict(group, algorithm="adamw") if is_zmuon(optim_info) else group


def loss_of(w, b, x):
    return (w.mv(x) + b).pow(2).sum()


def fwd_bwd(opt, w, b, x):
    opt.zero_grad()
    loss = loss_of(w, b, x)
    loss.backward()
    return loss


def without_param_names(sd):
    sd = copy.deepcopy(sd)
    for g in sd["param_groups"]:
        g.pop("param_names", None)
    return sd


def named(params, on):
    return [(f"name{i}", p) for i, p in enumerate(params)] if on else params


def state_dict_pre_hook(opt):
    opt.state["test"] = 1


def state_dict_post_hook(opt, sd):
    sd["ran_state_dict_pre_hook"] = "test" in sd["state"]
    sd["state"].pop("test", None)
    return sd


def load_pre_hook_in_place(opt, sd):
    sd["param_groups"][0]["lr"] = 0.002


def load_pre_hook_returning(opt, sd):
    sd = copy.deepcopy(sd)
    sd["param_groups"][0]["lr"] = 0.003
    return sd


def load_post_hook(opt):
    opt.state["ran_load_pre_hook_returning"] = opt.param_groups[0]["lr"] == 0.003
    opt.state["ran_load_post_hook"] = True


class TestConformance(TestCase):

    @optims(BOTH)
    def test_inputs_name_no_global_flags(self, device, dtype, optim_info):
        """test_optim_infos_do_not_specify_global_cliquey_kwargs"""
        for optim_input in optim_info.optim_inputs_func(device=device):
            self.assertFalse({"foreach", "fused", "differentiable"} & set(optim_input.kwargs))

    @optims(BOTH)
    def test_errors(self, device, dtype, optim_info):
        """test_errors: each bad hyperparameter raises at construction."""
        for error in optim_info.optim_error_inputs_func(device=device, dtype=dtype):
            given = error.optimizer_error_input
            with self.assertRaisesRegex(error.error_type, error.error_regex):
                optim_info.optim_cls(given.params, **given.kwargs)

    @optims(BOTH)
    def test_errors_for_every_optimizer(self, device, dtype, optim_info):
        """test_errors with torch's inputs for every optimizer
        (get_error_inputs_for_all_optims): zmuon raises or warns with torch's type, except where
        it differs by design (EXPECTED_DIFFERENCES)."""
        differences = EXPECTED_DIFFERENCES if is_zmuon(optim_info) else {}
        for error in get_error_inputs_for_all_optims(device, dtype):
            given = error.optimizer_error_input
            params = given.params
            if params is None:  # torch checks the lr first; zmuon the parameters first
                params = [Parameter(torch.randn(2, 2, device=device, dtype=dtype))]
            want = differences.get(given.desc, error.error_type)
            with self.subTest(given.desc):
                if want is None:
                    optim_info.optim_cls(params, **given.kwargs)
                elif issubclass(want, Warning):
                    with self.assertWarns(want):
                        optim_info.optim_cls(params, **given.kwargs)
                else:
                    with self.assertRaises(want):
                        optim_info.optim_cls(params, **given.kwargs)

    @parametrize("contiguous", [True, False])
    @parametrize("with_lrsched", [True, False])
    @optims(BOTH)
    def test_goes_right_direction(self, device, dtype, optim_info, contiguous, with_lrsched):
        """test_forloop_goes_right_direction: 20 steps lower the loss, on contiguous and strided
        parameters, with and without StepLR / ReduceLROnPlateau."""
        for schedulers_c in (optim_info.scheduler_inputs if with_lrsched else [[]]):
            for optim_input in optim_info.optim_inputs_func(device=device):
                if contiguous:
                    w = Parameter(torch.randn(10, 5, device=device, dtype=dtype))
                    b = Parameter(torch.randn(10, device=device, dtype=dtype))
                else:
                    w = Parameter(torch.randn(10, 5, 2, device=device, dtype=dtype)[..., 0])
                    b = Parameter(torch.randn(10, 2, device=device, dtype=dtype)[..., 0])
                x = torch.randn(5, device=device, dtype=dtype)
                opt = optim_info.optim_cls([w, b], **optim_input.kwargs)
                schedulers = [s(opt) for s in schedulers_c]
                initial = loss_of(w, b, x).item()
                for _ in range(20):
                    loss = fwd_bwd(opt, w, b, x)
                    opt.step()
                    for s in schedulers:
                        s.step(loss) if isinstance(s, ReduceLROnPlateau) else s.step()
                self.assertLess(loss_of(w, b, x).item(), initial)
                self.assertEqual(w.is_contiguous(), contiguous)

    @optims(BOTH)
    def test_param_group_with_lrscheduler_goes_right_direction(self, device, dtype, optim_info):
        """test_param_group_with_lrscheduler_goes_right_direction"""
        for schedulers_c in optim_info.scheduler_inputs:
            w = Parameter(torch.randn(10, 5, device=device, dtype=dtype))
            b = Parameter(torch.randn(10, device=device, dtype=dtype))
            x = torch.randn(5, device=device, dtype=dtype)
            opt = optim_info.optim_cls([{"params": [w]}, {"params": [b], "lr": 0.01}])
            schedulers = [s(opt) for s in schedulers_c]
            initial = loss_of(w, b, x).item()
            for _ in range(20):
                loss = opt.step(functools.partial(fwd_bwd, opt, w, b, x))
                for s in schedulers:
                    s.step(loss) if isinstance(s, ReduceLROnPlateau) else s.step()
            self.assertLess(loss_of(w, b, x).item(), initial)

    @optims(BOTH)
    def test_tensor_lr(self, device, dtype, optim_info):
        """test_tensor_lr: lr as a 0-d tensor steps as the same float."""
        for optim_input in inputs(device, dtype, optim_info):
            w = Parameter(torch.randn(10, 5, device=device, dtype=dtype))
            b = Parameter(torch.randn(10, device=device, dtype=dtype))
            w_c, b_c = (Parameter(t.detach().clone()) for t in (w, b))
            x = torch.randn(5, device=device, dtype=dtype)
            kwargs = dict(optim_input.kwargs, lr=1e-3)
            opt_r = optim_info.optim_cls([w, b], **kwargs)
            opt = optim_info.optim_cls([w_c, b_c], **dict(kwargs, lr=torch.tensor(1e-3)))
            for _ in range(5):
                opt_r.step(functools.partial(fwd_bwd, opt_r, w, b, x))
                opt.step(functools.partial(fwd_bwd, opt, w_c, b_c, x))
                self.assertEqual(w, w_c)
                self.assertEqual(b, b_c)

    @optims(BOTH)
    def test_param_groups_weight_decay(self, device, dtype, optim_info):
        """test_param_groups_weight_decay: a group with its own weight_decay."""
        for optim_input in inputs(device, dtype, optim_info):
            w = Parameter(torch.randn(10, 5, device=device, dtype=dtype))
            b = Parameter(torch.randn(10, device=device, dtype=dtype))
            x = torch.randn(5, device=device, dtype=dtype)
            opt = optim_info.optim_cls([dict(params=[w], **optim_input.kwargs),
                                        dict(params=[b], **dict(optim_input.kwargs,
                                                                weight_decay=0.0))])
            initial = loss_of(w, b, x).item()
            for _ in range(20):
                fwd_bwd(opt, w, b, x)
                opt.step()
            self.assertLess(loss_of(w, b, x).item(), initial)
            self.assertEqual(opt.param_groups[1]["weight_decay"], 0.0)

    @optims(BOTH)
    def test_param_groups_lr(self, device, dtype, optim_info):
        """test_param_groups_lr: a group's own lr; a group without one takes the defaults' (for
        zmuon's AdamW group that is `adam_lr`, so both rates are given)."""
        for optim_input in inputs(device, dtype, optim_info):
            kwargs = dict(optim_input.kwargs)
            kwargs.setdefault("lr", 1e-3)
            outer = {"lr": 1e-28}
            if is_zmuon(optim_info):
                outer["adam_lr"] = 1e-28
            w = Parameter(torch.randn(10, 5, device=device, dtype=dtype))
            b = Parameter(torch.randn(10, device=device, dtype=dtype))
            irrelevant = Parameter(torch.randn(2, device=device, dtype=dtype))
            before = irrelevant.detach().clone()
            x = torch.randn(5, device=device, dtype=dtype)
            opt = optim_info.optim_cls([one_algorithm(optim_info, dict(params=[w, b], **kwargs)),
                                        dict(params=[irrelevant])], **outer)
            initial = loss_of(w, b, x).item()
            for _ in range(20):
                fwd_bwd(opt, w, b, x)
                irrelevant.grad = torch.rand_like(irrelevant)
                opt.step()
            self.assertLess(loss_of(w, b, x).item(), initial)
            self.assertEqual(irrelevant, before)

    @optims([ZMUON])
    def test_a_mixed_group_among_groups_is_named(self, device, dtype, optim_info):
        """zmuon's difference to test_param_groups_lr's groups: a matrix and a vector in one of
        several groups need the group's algorithm."""
        w = Parameter(torch.randn(10, 5, device=device, dtype=dtype))
        b = Parameter(torch.randn(10, device=device, dtype=dtype))
        c = Parameter(torch.randn(2, device=device, dtype=dtype))
        with self.assertRaisesRegex(zmuon.InvalidArgument, "use_muon"):
            zmuon.Muon([{"params": [w, b]}, {"params": [c]}])

    @optims(BOTH)
    def test_step_is_noop_when_params_have_no_grad(self, device, dtype, optim_info):
        """test_step_is_noop_when_params_have_no_grad: step(closure) without any .grad changes
        nothing and returns the closure's loss."""
        for optim_input in inputs(device, dtype, optim_info):
            params = [torch.randn(2, 3, device=device, dtype=dtype) for _ in range(2)]
            before = [p.clone() for p in params]
            opt = optim_info.optim_cls(params, **optim_input.kwargs)
            loss = opt.step(lambda: torch.tensor([1.0], device=device, dtype=dtype))
            self.assertEqual(loss, torch.tensor([1.0], device=device, dtype=dtype))
            self.assertEqual(params, before, atol=0, rtol=0)

    @optims(BOTH)
    def test_step_is_noop_for_zero_grads(self, device, dtype, optim_info):
        """test_step_is_noop_for_zero_grads, without weight decay (AdamW's default decays)."""
        for optim_input in inputs(device, dtype, optim_info):
            param = torch.randn(5, 1, device=device, dtype=dtype, requires_grad=True)
            before = param.detach().clone()
            opt = optim_info.optim_cls([param], **dict(optim_input.kwargs, weight_decay=0.0))
            param.grad = torch.zeros_like(param)
            opt.step(lambda: torch.tensor([1.0], device=device, dtype=dtype))
            self.assertEqual(param, before, atol=0, rtol=0)

    @optims(BOTH)
    def test_optimizer_can_be_printed(self, device, dtype, optim_info):
        """test_optimizer_can_be_printed: repr names the optimizer and its groups."""
        params = [Parameter(torch.randn(2, 3, device=device, dtype=dtype)) for _ in range(2)]
        for optim_input in inputs(device, dtype, optim_info):
            text = repr(optim_info.optim_cls(params, **optim_input.kwargs))
            self.assertIn("Muon" if is_zmuon(optim_info) else "AdamW", text)
            self.assertRegex(text, "[Gg]roup|parameters")

    @parametrize("named0", [True, False])
    @parametrize("named1", [True, False])
    @optims(BOTH)
    def test_state_dict_deterministic(self, device, dtype, optim_info, named0, named1):
        """test_state_dict_deterministic: a fresh optimizer loaded from a deepcopy of the state
        dict runs the same steps (bit for bit), and both state dicts agree (names apart); a
        repeated group is packed as the first."""
        w = Parameter(torch.randn(2, 3, device=device, dtype=dtype))
        b = Parameter(torch.randn(2, device=device, dtype=dtype))
        x = torch.randn(3, device=device, dtype=dtype)
        for optim_input in inputs(device, dtype, optim_info):
            opt = optim_info.optim_cls(named([w, b], named0), **optim_input.kwargs)
            for _ in range(10):
                fwd_bwd(opt, w, b, x)
                opt.step()
            with torch.no_grad():
                w_c, b_c = Parameter(w.clone()), Parameter(b.clone())
            opt_c = optim_info.optim_cls(named([w_c, b_c], named1), **optim_input.kwargs)
            opt_c.load_state_dict(copy.deepcopy(opt.state_dict()))
            for _ in range(10):
                fwd_bwd(opt, w, b, x)
                fwd_bwd(opt_c, w_c, b_c, x)
                opt.step()
                opt_c.step()
                self.assertEqual(w, w_c, atol=0, rtol=0)
                self.assertEqual(b, b_c, atol=0, rtol=0)
            self.assertEqual(without_param_names(opt.state_dict()),
                             without_param_names(opt_c.state_dict()))
            opt_c.param_groups.extend(opt_c.param_groups)
            self.assertEqual(without_param_names(opt.state_dict())["param_groups"][-1],
                             without_param_names(opt_c.state_dict())["param_groups"][-1])

    @optims(BOTH)
    def test_can_load_older_state_dict(self, device, dtype, optim_info):
        """test_can_load_older_state_dict: a state dict without the newer group keys
        (not_og_supported_flags) loads, and the optimizer steps on."""
        for optim_input in inputs(device, dtype, optim_info):
            torch.manual_seed(1)
            model = torch.nn.Sequential(torch.nn.Conv2d(4, 2, 1, stride=2),
                                        torch.nn.BatchNorm2d(2, eps=1e-05, momentum=0.1))
            model.to(dtype=dtype, device=device)
            x = torch.rand(1, 4, 16, 16, device=device, dtype=dtype)
            opt = optim_info.optim_cls(model.parameters(), **optim_input.kwargs)
            for _ in range(3):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            old = copy.deepcopy(opt.state_dict())
            for g in old["param_groups"]:
                for flag in optim_info.not_og_supported_flags:
                    g.pop(flag, None)
            opt.load_state_dict(old)
            before = [p.detach().clone() for p in model.parameters()]
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            self.assertTrue(any(not torch.equal(a, p) for a, p in zip(before,
                                                                       model.parameters())))

    @parametrize("named0", [True, False])
    @parametrize("named1", [True, False])
    @optims(BOTH)
    def test_can_load_from_to_named_state_dict(self, device, dtype, optim_info, named0, named1):
        """test_can_load_from_to_named_state_dict: a state dict of named_parameters() loads into
        an optimizer of parameters() and back; the names given to either side are kept (zmuon
        splits the model into Muon's and AdamW's groups: the names over all groups)."""
        for optim_input in inputs(device, dtype, optim_info):
            torch.manual_seed(1)
            model = torch.nn.Sequential(torch.nn.Conv2d(4, 2, 1, stride=2),
                                        torch.nn.BatchNorm2d(2, eps=1e-05, momentum=0.1))
            model.to(dtype=dtype, device=device)
            x = torch.rand(1, 4, 16, 16, device=device, dtype=dtype)

            def params(on):
                return model.named_parameters() if on else model.parameters()

            opt = optim_info.optim_cls(params(named0), **optim_input.kwargs)
            for _ in range(3):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            opt2 = optim_info.optim_cls(params(named1), **optim_input.kwargs)
            opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
            opt2.zero_grad()
            model(x).sum().backward()
            opt2.step()
            if named0 or named1:
                names = [n for g in opt2.state_dict()["param_groups"] for n in g["param_names"]]
                self.assertEqual(names, ["0.weight", "0.bias", "1.weight", "1.bias"])

    @parametrize("named_params", [True, False])
    @optims(BOTH)
    def test_save_load_equality_with_weights_only(self, device, dtype, optim_info, named_params):
        """test_save_load_equality_with_weights_only: torch.save, then torch.load with and
        without weights_only, gives the same state dict."""
        w = Parameter(torch.randn(2, 3, device=device, dtype=dtype))
        b = Parameter(torch.randn(2, device=device, dtype=dtype))
        x = torch.randn(3, device=device, dtype=dtype)
        for optim_input in inputs(device, dtype, optim_info):
            opt = optim_info.optim_cls(named([w, b], named_params), **optim_input.kwargs)
            for _ in range(3):
                opt.step(functools.partial(fwd_bwd, opt, w, b, x))
            sd = opt.state_dict()
            with tempfile.TemporaryFile() as f:
                torch.save(sd, f)
                f.seek(0)
                self.assertEqual(torch.load(f, weights_only=False), sd)
                f.seek(0)
                self.assertEqual(torch.load(f, weights_only=True), sd)

    @optims(BOTH)
    def test_load_nontensor_step(self, device, dtype, optim_info):
        """test_load_nontensor_step: a state dict whose step counts are Python numbers loads,
        and the next step is the one the tensor counts give (bit for bit)."""
        for optim_input in inputs(device, dtype, optim_info):
            runs = []
            for plain_numbers in (False, True):
                torch.manual_seed(2)
                params = [Parameter(torch.randn(2, 3, device=device, dtype=dtype))
                          for _ in range(2)]
                for p in params:
                    p.grad = torch.rand_like(p)
                opt = optim_info.optim_cls(params, **optim_input.kwargs)
                for _ in range(3):
                    opt.step()
                sd = copy.deepcopy(opt.state_dict())
                for entry in sd["state"].values():
                    if plain_numbers and torch.is_tensor(entry.get("step")):
                        entry["step"] = entry["step"].item()
                opt.load_state_dict(sd)
                opt.step()
                runs.append(params)
            self.assertEqual(runs[0], runs[1], atol=0, rtol=0)

    @optims(BOTH)
    def test_state_dict_loads_cast_to_the_parameters(self, device, dtype, optim_info):
        """test_state_dict_with_cuda_params on one device: a state dict whose tensors are of
        another dtype (float64) loads cast to the parameters', and the steps then match the
        optimizer it came from."""
        for optim_input in inputs(device, dtype, optim_info):
            params = [Parameter(torch.randn(2, 3, device=device, dtype=dtype)) for _ in range(2)]
            for p in params:
                p.grad = torch.randn_like(p)
            opt = optim_info.optim_cls(params, **optim_input.kwargs)
            for _ in range(3):
                opt.step()
            twins = [Parameter(p.detach().clone()) for p in params]
            for t, p in zip(twins, params):
                t.grad = p.grad.clone()
            opt_c = optim_info.optim_cls(twins, **optim_input.kwargs)
            sd = copy.deepcopy(opt.state_dict())
            wide = {i: {k: (v.double() if torch.is_tensor(v) and v.is_floating_point()
                            and v.ndim > 0 else v) for k, v in entry.items()}
                    for i, entry in sd["state"].items()}
            opt_c.load_state_dict(dict(sd, state=wide))
            for _ in range(5):
                opt.step()
                opt_c.step()
                self.assertEqual(params, twins, atol=0, rtol=0)
            self.assertEqual(opt.state_dict()["state"], opt_c.state_dict()["state"])

    @onlyCUDA
    @optims(BOTH)
    def test_state_dict_with_cuda_params(self, device, dtype, optim_info):
        """test_state_dict_with_cuda_params: a CPU optimizer's state dict loads into one of the
        same parameters on the GPU, unchanged by the load, and both step alike."""
        for optim_input in inputs("cpu", dtype, optim_info):
            params = [Parameter(torch.randn(2, 3, dtype=dtype)) for _ in range(2)]
            for p in params:
                p.grad = torch.randn_like(p)
            opt = optim_info.optim_cls(params, **optim_input.kwargs)
            for _ in range(3):
                opt.step()
            with torch.no_grad():
                on_gpu = [Parameter(p.to(device)) for p in params]
            for g, p in zip(on_gpu, params):
                g.grad = p.grad.to(device)
            opt_gpu = optim_info.optim_cls(on_gpu, **optim_input.kwargs)
            sd, sd_copy = copy.deepcopy(opt.state_dict()), copy.deepcopy(opt.state_dict())
            opt_gpu.load_state_dict(sd_copy)
            self.assertEqual(sd, sd_copy)
            for _ in range(5):
                opt.step()
                opt_gpu.step()
                # the GPU's own rounding (zmuon's NS in bf16 on the GPU): a loose bound
                self.assertEqual(params, [g.cpu() for g in on_gpu], atol=2e-2, rtol=2e-2)

    @optims(BOTH)
    def test_state_dict_pre_hook(self, device, dtype, optim_info):
        """test_state_dict_pre_hook: a key the pre hook puts in opt.state is in the dict."""
        for opt in one_tensor_optimizers(device, dtype, optim_info):
            opt.register_state_dict_pre_hook(state_dict_pre_hook)
            self.assertEqual(opt.state_dict()["state"]["test"], 1)

    @optims(BOTH)
    def test_state_dict_post_hook(self, device, dtype, optim_info):
        """test_state_dict_post_hook: the post hook's dict is the one returned."""
        for opt in one_tensor_optimizers(device, dtype, optim_info):
            opt.register_state_dict_post_hook(state_dict_post_hook)
            self.assertFalse(opt.state_dict()["ran_state_dict_pre_hook"])

    @optims(BOTH)
    def test_state_dict_pre_post_hook(self, device, dtype, optim_info):
        """test_state_dict_pre_post_hook: pre, then the dict, then post."""
        for opt in one_tensor_optimizers(device, dtype, optim_info):
            opt.register_state_dict_pre_hook(state_dict_pre_hook)
            opt.register_state_dict_post_hook(state_dict_post_hook)
            sd = opt.state_dict()
            self.assertNotIn("test", sd["state"])
            self.assertTrue(sd["ran_state_dict_pre_hook"])

    @optims(BOTH)
    def test_load_state_dict_pre_hook_and_prepend(self, device, dtype, optim_info):
        """test_load_state_dict_pre_hook_and_prepend: a pre hook changes the dict in place; one
        registered with prepend=True runs first (its dict is then changed by the other)."""
        for opt in one_tensor_optimizers(device, dtype, optim_info):
            sd = opt.state_dict()
            opt.register_load_state_dict_pre_hook(load_pre_hook_in_place)
            opt.load_state_dict(sd)
            self.assertEqual(opt.param_groups[0]["lr"], 0.002)
            opt.register_load_state_dict_pre_hook(load_pre_hook_returning, prepend=True)
            opt.load_state_dict(sd)
            self.assertEqual(opt.param_groups[0]["lr"], 0.002)

    @optims(BOTH)
    def test_load_state_dict_post_hook(self, device, dtype, optim_info):
        """test_load_state_dict_post_hook: it runs after the load, with the optimizer."""
        for opt in one_tensor_optimizers(device, dtype, optim_info):
            opt.register_load_state_dict_post_hook(load_post_hook)
            opt.load_state_dict(opt.state_dict())
            self.assertFalse(opt.state["ran_load_pre_hook_returning"])
            self.assertTrue(opt.state["ran_load_post_hook"])

    @optims(BOTH)
    def test_load_state_dict_pre_post_hook(self, device, dtype, optim_info):
        """test_load_state_dict_pre_post_hook: the pre hook's returned dict is the one loaded."""
        for opt in one_tensor_optimizers(device, dtype, optim_info):
            opt.register_load_state_dict_pre_hook(load_pre_hook_returning)
            opt.register_load_state_dict_post_hook(load_post_hook)
            opt.load_state_dict(opt.state_dict())
            self.assertTrue(opt.state["ran_load_pre_hook_returning"])
            self.assertTrue(opt.state["ran_load_post_hook"])

    @optims(BOTH)
    def test_step_pre_and_post_hook(self, device, dtype, optim_info):
        """test_step_pre_hook and test_step_post_hook: each runs once a step until removed
        (a step without gradients)."""
        for optim_input in inputs(device, dtype, optim_info):
            opt = optim_info.optim_cls([torch.tensor([1.0, 1.0], device=device, dtype=dtype)],
                                       **optim_input.kwargs)
            calls = []
            pre = opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
            post = opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
            opt.step()
            opt.step()
            pre.remove()
            post.remove()
            opt.step()
            self.assertEqual(calls, ["pre", "post"] * 2)

    @optims(BOTH)
    def test_step_all_hooks(self, device, dtype, optim_info):
        """test_step_all_hooks: global pre, own pre, own post, global post; beside SGD."""
        for optim_input in inputs(device, dtype, optim_info):
            params = [torch.tensor([1.0, 1.0], device=device, dtype=dtype)]
            opt, sgd = optim_info.optim_cls(params, **optim_input.kwargs), SGD(params)
            data = []
            handles = [register_optimizer_step_pre_hook(lambda o, a, k: data.append(0)),
                       register_optimizer_step_post_hook(lambda o, a, k: data.append(5))]
            for o in (opt, sgd):
                handles.append(o.register_step_pre_hook(lambda o, a, k: data.append(1)))
                handles.append(o.register_step_post_hook(lambda o, a, k: data.append(2)))
            try:
                opt.step()
                sgd.step()
                opt.step()
            finally:
                for h in handles:
                    h.remove()
            opt.step()
            sgd.step()
            self.assertEqual(data, [0, 1, 2, 5] * 3)

    @optims(BOTH)
    def test_non_empty_state(self, device, dtype, optim_info):
        """test_non_empty_state: after a step every parameter has state."""
        model = torch.nn.Linear(5, 5).to(device=device, dtype=dtype)
        x = torch.rand(2, 5, device=device, dtype=dtype)
        for optim_input in optim_info.optim_inputs_func(device=device):
            opt = optim_info.optim_cls(model.parameters(), **optim_input.kwargs)
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
            self.assertEqual(len(opt.state), 2)
            for state in opt.state.values():
                self.assertGreater(len(state), 0)

    @optims(BOTH)
    def test_zero_grad(self, device, dtype, optim_info):
        """zero_grad (Optimizer.zero_grad): set_to_none drops .grad, False zeroes it in place."""
        w = Parameter(torch.randn(3, 2, device=device, dtype=dtype))
        b = Parameter(torch.randn(3, device=device, dtype=dtype))
        opt = optim_info.optim_cls([w, b])
        w.grad, b.grad = torch.ones_like(w), torch.ones_like(b)
        kept = w.grad
        opt.zero_grad(set_to_none=False)
        self.assertIs(w.grad, kept)
        self.assertEqual(w.grad, torch.zeros_like(w), atol=0, rtol=0)
        opt.zero_grad()
        self.assertIsNone(w.grad)
        self.assertIsNone(b.grad)

    @optims(BOTH)
    def test_add_param_group_keeps_its_keys(self, device, dtype, optim_info):
        """Optimizer.add_param_group: the new group keeps its own keys (also unknown ones),
        takes the others from the defaults, and its parameter is stepped from the next step."""
        w = Parameter(torch.randn(3, 2, device=device, dtype=dtype))
        extra = Parameter(torch.randn(4, device=device, dtype=dtype))
        opt = optim_info.optim_cls([w])
        w.grad = torch.ones_like(w)
        opt.step()
        opt.add_param_group({"params": [extra], "weight_decay": 0.25, "my_key": "kept"})
        group = opt.param_groups[-1]
        self.assertEqual((group["weight_decay"], group["my_key"]), (0.25, "kept"))
        self.assertEqual(group["eps"], opt.defaults["eps"])
        self.assertEqual(group["params"], [extra])
        before = extra.detach().clone()
        extra.grad = torch.ones_like(extra)
        opt.step()
        self.assertFalse(torch.equal(before, extra))
        with self.assertRaisesRegex(ValueError, "more than one parameter group"):
            opt.add_param_group({"params": [extra]})

    @optims(BOTH)
    def test_deepcopy_copies_all_public_attrs(self, device, dtype, optim_info):
        """test_deepcopy_copies_all_public_attrs, and the copy steps as the original would
        (bit for bit) on copies of the parameters."""
        for optim_input in inputs(device, dtype, optim_info):
            params = [Parameter(torch.randn(2, 3, device=device, dtype=dtype))
                      for _ in range(2)]
            for p in params:
                p.grad = torch.rand_like(p)
            opt = optim_info.optim_cls(params, **optim_input.kwargs)
            for _ in range(3):
                opt.step()
            twin = copy.deepcopy(opt)
            public = {k for k in opt.__dict__ if not k.startswith("_")}
            self.assertEqual(public, {k for k in twin.__dict__ if not k.startswith("_")})
            copies = [p for g in twin.param_groups for p in g["params"]]
            self.assertTrue(all(c is not p for c, p in zip(copies, params)))
            for c in copies:
                c.grad = torch.rand_like(c)
            for p, c in zip([p for g in opt.param_groups for p in g["params"]], copies):
                p.grad = c.grad.clone()
            opt.step()
            twin.step()
            self.assertEqual([p for g in opt.param_groups for p in g["params"]], copies,
                             atol=0, rtol=0)

    @optims([ZMUON])
    def test_complex_parameters_are_refused_by_dtype(self, device, dtype, optim_info):
        """test_complex's parameters: zmuon refuses them, naming the dtype."""
        z = torch.randn(3, 3, device=device, dtype=torch.complex64, requires_grad=True)
        with self.assertRaisesRegex(TypeError, "complex64"):
            zmuon.Muon([z])


# Where zmuon raises or warns otherwise than torch.optim for get_error_inputs_for_all_optims's
# inputs (None: accepted).
EXPECTED_DIFFERENCES = {
    "a param group cannot have duplicate parameters": zmuon.DuplicateParameter,
    "all optimizer params should be with/without names": None,
    "all optimizer param groups should be with/without names.": None,
}

instantiate_device_type_tests(TestConformance, globals(), only_for=("cpu", "cuda"))

if __name__ == "__main__":
    unittest.main()
