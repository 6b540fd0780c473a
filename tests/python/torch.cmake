# The torch tests: zmuon.Muon as a torch.optim.Optimizer (test_torch_optim), its state in torch's
# shape (test_torch_state), parameters as torch.optim takes them (test_torch_parameters), under
# Lightning and HF Trainer (test_torch_frameworks), and under DDP and FSDP2
# (test_torch_distributed). They run with the venv that `.ci/deps --tests` makes (.venv at the repository
# root, .ci/requirements.txt); without it they fail, they never skip.
set(ZMUON_TORCH_PYTHON ${PROJECT_SOURCE_DIR}/.venv/bin/python)
foreach(test test_torch_optim test_torch_state test_torch_frameworks test_torch_deepspeed
    test_torch_muon_blocks)
  zmuon_add_python_test(python_${test} MODULE ${test} PYTHON ${ZMUON_TORCH_PYTHON} TIMEOUT 300
    LABELS embed torch ENV "HF_HUB_OFFLINE=1")
endforeach()

# test_binding's torch part (test_python_binding runs under the system python, without torch):
# torch tensors against numpy arrays, host staging, numpy parameters beside an imported torch.
zmuon_add_python_test(python_test_binding_torch MODULE test_binding.TorchTensors
  PYTHON ${ZMUON_TORCH_PYTHON} TIMEOUT 300 LABELS embed torch ENV "ZMUON_TEST_TORCH=required")

# zmuon.Muon under torch.distributed (gloo): DDP and FSDP2 jobs of 2 to 4 processes.
zmuon_add_python_test(python_test_torch_distributed MODULE test_torch_distributed
  PYTHON ${ZMUON_TORCH_PYTHON} TIMEOUT 900 LABELS embed torch ENV "HF_HUB_OFFLINE=1")
# DTensor parameters of any placement (gloo, 4 processes): the placement reader against DTensor,
# HSDP 2 x 2, FSDP2 with an MoE layer, tensor parallel 2 x FSDP2 2, expert parallel 2 x FSDP2 2,
# DCP across meshes, each against one process.
zmuon_add_python_test(python_test_torch_mesh MODULE test_torch_mesh
  PYTHON ${ZMUON_TORCH_PYTHON} TIMEOUT 900 LABELS embed torch)

# pip install . into a fresh venv and the parity test from outside the checkout.
add_test(NAME python_test_pip_install
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/pip_install_check.sh ${PROJECT_SOURCE_DIR}
          ${CMAKE_CURRENT_BINARY_DIR}/pip_install ${PROJECT_SOURCE_DIR}/.venv
          ${PROJECT_BINARY_DIR} ${ZMUON_CUDA})
# It reconfigures the build directory, so nothing else may configure or build there meanwhile.
set_tests_properties(python_test_pip_install PROPERTIES TIMEOUT 600 LABELS "embed;torch"
  RUN_SERIAL TRUE)

# cautious_weight_decay= and variant="normuon" against a float64 torch reference, and their state.
zmuon_add_python_test(python_test_torch_cautious_normuon MODULE test_torch_cautious_normuon
  PYTHON ${ZMUON_TORCH_PYTHON} TIMEOUT 300 LABELS embed torch)

# variant="normuon" on expert stacks and split blocks against a float64 NorMuon per block, and
# an expert stack's row moments through state_dict() at another rank count.
zmuon_add_python_test(python_test_torch_normuon_blocks MODULE test_torch_normuon_blocks
  PYTHON ${ZMUON_TORCH_PYTHON} TIMEOUT 300 LABELS embed torch)

# algorithm="lion" for a param group against a float64 Lion.
zmuon_add_python_test(python_test_torch_lion MODULE test_torch_lion
  PYTHON ${ZMUON_TORCH_PYTHON} TIMEOUT 300 LABELS embed torch)
# Parameters as torch.optim takes them: writes outside zmuon, unnamed, 0-d, strided, bf16 (200
# steps, five runs), add_param_group mid-run, cycled momentum, hooks.
zmuon_add_python_test(python_test_torch_parameters MODULE test_torch_parameters
  PYTHON ${ZMUON_TORCH_PYTHON} TIMEOUT 600 LABELS embed torch)
