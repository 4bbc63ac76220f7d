"""rig.failures: how an attempt ended, from its facts and the tail of its log."""

from __future__ import annotations

import dataclasses
import random

import pytest

from rig.failures import (
    Classification,
    FailureClass,
    classify,
    classify_failure,
    read_tail,
    suggest_memory,
)

GIB = 1024**3
MIB = 1024**2

# --- realistic surroundings ------------------------------------------------------------------

TORCH_TRACEBACK = """\
[2024-05-01 12:03:11,482][train][INFO] - epoch 3 step 2210 loss 2.3127 lr 2.9e-04
Epoch 3:  42%|####2     | 210/500 [03:12<04:25,  1.09it/s, loss=2.31]
Traceback (most recent call last):
  File "/home/ana/proj/train.py", line 214, in <module>
    main()
  File "/home/ana/proj/train.py", line 187, in main
    loss = model(batch).loss
           ^^^^^^^^^^^^
  File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1736, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
  File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1747, in _call_impl
    return forward_call(*args, **kwargs)
  File "/opt/conda/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py", line 611, in forward
    attn_weights = torch.matmul(query_states, key_states.transpose(2, 3))
"""

TF_PREAMBLE = """\
2024-05-01 12:00:01.123456: I tensorflow/core/platform/cpu_feature_guard.cc:182] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
2024-05-01 12:00:03.551872: I tensorflow/core/common_runtime/gpu/gpu_device.cc:1929] Created device /job:localhost/replica:0/task:0/device:GPU:0 with 78911 MB memory:  -> device: 0, name: NVIDIA H100 80GB HBM3, pci bus id: 0000:1b:00.0, compute capability: 9.0
Epoch 1/20
 118/1563 [=>............................] - ETA: 2:41 - loss: 1.9876 - accuracy: 0.2811
Traceback (most recent call last):
  File "/work/fit.py", line 57, in <module>
    model.fit(train_ds, epochs=20, validation_data=val_ds)
  File "/usr/local/lib/python3.11/dist-packages/keras/src/utils/traceback_utils.py", line 70, in error_handler
    raise e.with_traceback(filtered_tb) from None
  File "/usr/local/lib/python3.11/dist-packages/tensorflow/python/eager/execute.py", line 53, in quick_execute
    tensors = pywrap_tfe.TFE_Py_Execute(ctx._handle, device_name, op_name,
"""

JAX_PREAMBLE = """\
I0501 12:00:02.114511 140231 xla_bridge.py:884] Unable to initialize backend 'rocm': NOT_FOUND: Could not find registered platform with name: "rocm".
step 100 | loss 3.412 | 1532 tok/s
Traceback (most recent call last):
  File "/home/ana/jaxproj/train.py", line 91, in <module>
    state, metrics = train_step(state, batch)
                     ^^^^^^^^^^^^^^^^^^^^^^^^
  File "/home/ana/.venv/lib/python3.11/site-packages/jax/_src/traceback_util.py", line 180, in reraise_with_filtered_traceback
    return fun(*args, **kwargs)
"""

CUPY_PREAMBLE = """\
loading 1024 shards from /data/shards
Traceback (most recent call last):
  File "/home/ana/sim/run.py", line 33, in <module>
    grid = cp.zeros((n, n), dtype=cp.float32)
  File "/home/ana/.venv/lib/python3.11/site-packages/cupy/_creation/basic.py", line 248, in zeros
    a = cupy.ndarray(shape, dtype, order=order)
  File "cupy/_core/core.pyx", line 132, in cupy._core.core.ndarray.__new__
  File "cupy/cuda/memory.pyx", line 738, in cupy.cuda.memory.alloc
"""

TORCH_ASYNC_NOTE = """\
CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
For debugging consider passing CUDA_LAUNCH_BLOCKING=1
Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""

NCCL_PREAMBLE = """\
[rank0]:[I ProcessGroupNCCL.cpp:686] [Rank 0] ProcessGroupNCCL initialization options: NCCL_ASYNC_ERROR_HANDLING: 1, NCCL_DESYNC_DEBUG: 0, NCCL_ENABLE_TIMING: 0, NCCL_BLOCKING_WAIT: 0, TIMEOUT(ms): 600000, USE_HIGH_PRIORITY_STREAM: 0
gpu-node-07:12345:12345 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>
gpu-node-07:12345:12345 [0] NCCL INFO cudaDriverVersion 12040
gpu-node-07:12345:12399 [0] NCCL INFO Channel 00/02 :    0   1   2   3
"""

TORCH_OOM_NEW = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.15 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process "
    "has 77.90 GiB memory in use. Of the allocated memory 76.50 GiB is allocated by PyTorch, and "
    "0.90 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large "
    "try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
    "documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
TORCH_OOM_OLD = (
    "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total "
    "capacity; 14.56 GiB already allocated; 3.44 MiB free; 14.70 GiB reserved in total by "
    "PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
TF_OOM = (
    "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor "
    "with shape[8192,8192] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by "
    "allocator GPU_0_bfc"
)
JAX_OOM = (
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
    "allocate 17179869184 bytes."
)
JAX_BFC = (
    "2024-01-01 12:00:00.000000: W external/xla/xla/tsl/framework/bfc_allocator.cc:291] "
    "Allocator (GPU_0_bfc) ran out of memory trying to allocate 16.00GiB (rounded to "
    "17179869184)requested by op"
)
CUPY_OOM = (
    "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes "
    "(allocated so far: 0 bytes)."
)

# --- GPU out of memory -----------------------------------------------------------------------

OOM_CASES = [
    pytest.param(TORCH_TRACEBACK + TORCH_OOM_NEW + "\n", "pytorch",
                 "CUDA out of memory (PyTorch): tried to allocate 2.00 GiB", id="torch-2.x"),
    pytest.param(TORCH_TRACEBACK + TORCH_OOM_OLD + "\n", "pytorch",
                 "CUDA out of memory (PyTorch): tried to allocate 20.00 MiB", id="torch-1.x"),
    pytest.param(TORCH_TRACEBACK + "RuntimeError: CUDA error: out of memory\n" + TORCH_ASYNC_NOTE,
                 "pytorch", "CUDA out of memory (PyTorch)", id="torch-cuda-error-oom"),
    pytest.param(TORCH_TRACEBACK.replace("    attn_weights", "    raise torch.cuda.OutOfMemoryError()\n"
                                         "    attn_weights")
                 + "torch.cuda.OutOfMemoryError\n", "pytorch", "CUDA out of memory (PyTorch)",
                 id="torch-cuda-OutOfMemoryError-bare"),
    pytest.param(TORCH_TRACEBACK + "RuntimeError: cuda runtime error (2) : out of memory at "
                 "/pytorch/aten/src/THC/THCCachingAllocator.cpp:510\n", "pytorch",
                 "CUDA out of memory (PyTorch)", id="torch-0.4"),
    pytest.param(TF_PREAMBLE + TF_OOM + "\n", "tensorflow",
                 "CUDA out of memory (TensorFlow): tried to allocate tensor with shape[8192,8192] "
                 "and type float", id="tensorflow-eager"),
    pytest.param(TF_PREAMBLE
                 + "tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:\n\n"
                 "Detected at node 'model/dense_1/MatMul' defined at (most recent call last):\n"
                 "    File \"/work/fit.py\", line 57, in <module>\n"
                 "Node: 'model/dense_1/MatMul'\n"
                 "2 root error(s) found.\n"
                 "  (0) Resource exhausted: OOM when allocating tensor with shape[4096,32768] and "
                 "type half on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc\n"
                 "\t [[{{node model/dense_1/MatMul}}]]\n"
                 "Hint: If you want to see a list of allocated tensors when OOM happens, add "
                 "report_tensor_allocations_upon_oom to RunOptions for current allocation info.\n",
                 "tensorflow", "tensor with shape[4096,32768] and type half", id="tensorflow-graph"),
    pytest.param(JAX_PREAMBLE + JAX_BFC + "\n" + JAX_OOM + "\n", "jax",
                 "CUDA out of memory (JAX): tried to allocate 16.00 GiB", id="jax-xla"),
    pytest.param("step 200 | loss 2.1\n" + JAX_BFC + "\n"
                 "2024-01-01 12:00:00.000100: W external/xla/xla/tsl/framework/bfc_allocator.cc:"
                 "303] ****************************************************************xxxxx\n",
                 "jax", "CUDA out of memory (JAX): tried to allocate 16.00GiB", id="jax-bfc-warning"),
    pytest.param(CUPY_PREAMBLE + CUPY_OOM + "\n", "cupy",
                 "CUDA out of memory (CuPy): tried to allocate 1.00 GiB", id="cupy"),
    pytest.param(TORCH_TRACEBACK + "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when "
                 "calling `cublasCreate(handle)`\n", "pytorch",
                 "CUDA out of memory (PyTorch): CUBLAS_STATUS_ALLOC_FAILED", id="cublas"),
    pytest.param(TF_PREAMBLE.replace("Epoch 1/20\n", "Epoch 1/20\n2024-05-01 12:00:09.100201: E "
                                     "tensorflow/compiler/xla/stream_executor/cuda/cuda_dnn.cc:"
                                     "439] Could not create cudnn handle: "
                                     "CUDNN_STATUS_ALLOC_FAILED\n"),
                 "tensorflow", "CUDA out of memory (TensorFlow): CUDNN_STATUS_ALLOC_FAILED",
                 id="cudnn"),
    pytest.param("Traceback (most recent call last):\n"
                 "  File \"/home/ana/kern.py\", line 12, in <module>\n"
                 "    d_a = cuda.to_device(a)\n"
                 "  File \"/home/ana/.venv/lib/python3.11/site-packages/numba/cuda/cudadrv/driver.py\","
                 " line 1354, in memalloc\n"
                 "numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in "
                 "CUDA_ERROR_OUT_OF_MEMORY\n",
                 None, "CUDA out of memory: CUDA_ERROR_OUT_OF_MEMORY", id="driver-numba"),
    pytest.param(CUPY_PREAMBLE + "cupy_backends.cuda.api.runtime.CUDARuntimeError: "
                 "cudaErrorMemoryAllocation: out of memory\n", "cupy",
                 "CUDA out of memory (CuPy): cudaErrorMemoryAllocation", id="cuda-runtime"),
]


@pytest.mark.parametrize(("log", "framework", "summary"), OOM_CASES)
def test_gpu_out_of_memory_is_recognised_for_every_framework(log, framework, summary):
    found = classify(exit_code=1, log_tail=log)
    assert found is not None
    assert found.failure is FailureClass.CUDA_OOM
    assert found.framework == framework
    assert summary in found.summary
    assert found.evidence, "an OOM is decided by log lines, which are its evidence"
    assert all(line in log for line in found.evidence)
    assert classify_failure(log) == found


def test_oom_summary_reads_like_the_spec():
    found = classify(exit_code=1, log_tail=TORCH_TRACEBACK + TORCH_OOM_NEW)
    assert found.summary == "CUDA out of memory (PyTorch): tried to allocate 2.00 GiB"
    assert found.evidence == (TORCH_OOM_NEW[:300],)


@pytest.mark.parametrize("exit_code", [1, 134, 137, -6, -9, 127, None])
def test_log_evidence_of_an_oom_wins_over_the_exit_code(exit_code):
    log = TORCH_TRACEBACK + TORCH_OOM_NEW + "\nAborted (core dumped)\nKilled\n"
    found = classify(exit_code=exit_code, log_tail=log)
    assert found.failure is FailureClass.CUDA_OOM


def test_the_last_oom_decides_the_summary_and_evidence_stays_in_log_order():
    log = (TORCH_TRACEBACK + TORCH_OOM_OLD + "\nretrying with batch size 16\n"
           + TORCH_TRACEBACK + TORCH_OOM_NEW + "\n")
    found = classify(exit_code=1, log_tail=log)
    assert found.summary.endswith("tried to allocate 2.00 GiB")
    assert found.evidence == (TORCH_OOM_OLD[:300], TORCH_OOM_NEW[:300])


def test_evidence_is_at_most_five_distinct_stripped_lines_cut_to_300_chars():
    ranks = "".join(f"[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                    f"{r}.00 GiB. GPU {r} has a total capacity of 79.15 GiB of which 0 bytes is "
                    f"free. {'x' * 400}\n" for r in range(8))
    repeated = "    RuntimeError: CUDA error: out of memory    \n" * 3
    found = classify(exit_code=1, log_tail=TORCH_TRACEBACK + ranks + repeated)
    assert len(found.evidence) == 5
    assert found.evidence[-1] == "RuntimeError: CUDA error: out of memory"
    assert [e[:7] for e in found.evidence[:4]] == ["[rank4]", "[rank5]", "[rank6]", "[rank7]"]
    assert all(len(e) <= 300 and e == e.strip() for e in found.evidence)
    assert found.summary.endswith("tried to allocate 7.00 GiB")


def test_colour_codes_and_progress_bar_carriage_returns_do_not_hide_the_error():
    log = ("Epoch 1:  10%|#         | 50/500\rEpoch 1:  11%|#1        | 55/500\r"
           "\x1b[31mtorch.OutOfMemoryError\x1b[0m: CUDA out of memory. Tried to allocate 512.00 "
           "MiB. GPU 0 has a total capacity of 23.65 GiB of which 100.00 MiB is free.\r\n")
    found = classify(exit_code=1, log_tail=log)
    assert found.failure is FailureClass.CUDA_OOM
    assert found.summary == "CUDA out of memory (PyTorch): tried to allocate 512.00 MiB"
    assert found.evidence[0].startswith("torch.OutOfMemoryError: CUDA out of memory.")


# --- not GPU out of memory -------------------------------------------------------------------

NOT_CUDA_OOM = [
    pytest.param("step 10 loss 0.5 memory usage: 12GB\nstep 20 loss 0.4 memory usage: 12GB\n"
                 "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n"
                 "ValueError: bad label 7\n", id="memory-usage"),
    pytest.param("validation done, no out-of-memory errors, peak GPU memory 61.2 GiB\n"
                 "Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\n"
                 "KeyError: 'labels'\n", id="no-oom-errors"),
    pytest.param("loading dataset\n[ 8123.441122] Out of memory: Killed process 1234 (python) "
                 "total-vm:81234560kB, anon-rss:63123456kB, file-rss:0kB, shmem-rss:0kB\nKilled\n",
                 id="kernel-oom-killer"),
    pytest.param("Traceback (most recent call last):\n  File \"prep.py\", line 40, in <module>\n"
                 "    rows = [parse(x) for x in open(path)]\nMemoryError\n", id="python-MemoryError"),
    pytest.param(TORCH_TRACEBACK.replace("    attn_weights",
                                         "    except torch.cuda.OutOfMemoryError:\n    attn_weights")
                 + "ValueError: Expected input batch_size (32) to match target batch_size (16).\n",
                 id="oom-in-source-line"),
    pytest.param(TF_PREAMBLE + "2024-05-01 12:00:05.000000: W tensorflow/core/common_runtime/"
                 "bfc_allocator.cc:290] Allocator (GPU_0_bfc) ran out of memory trying to allocate "
                 "2.15GiB with freed_by_count=0. The caller indicates that this is not a failure, "
                 "but this may mean that there could be performance gains if more memory were "
                 "available.\nValueError: Shapes (None, 10) and (None, 1) are incompatible\n",
                 id="tf-bfc-not-a-failure"),
    pytest.param(TF_PREAMBLE + "tensorflow.python.framework.errors_impl.ResourceExhaustedError: "
                 "OOM when allocating tensor with shape[50000,50000] and type float on "
                 "/job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu [Op:RandomUniform]\n",
                 id="tf-cpu-oom"),
    pytest.param(NCCL_PREAMBLE + "step 5 loss 1.0\nAssertionError: shapes differ\n",
                 id="nccl-init-options"),
    pytest.param("RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: "
                 "not enough memory: you tried to allocate 68719476736 bytes.\n", id="torch-cpu"),
]


@pytest.mark.parametrize("log", NOT_CUDA_OOM)
def test_these_logs_are_not_gpu_failures(log):
    assert classify_failure(log) is None
    found = classify(exit_code=1, log_tail=log)
    assert found.failure is FailureClass.NONZERO_EXIT


@pytest.mark.parametrize(
    "line",
    [
        "Traceback (most recent call last):\n  File \"prep.py\", line 40, in <module>\nMemoryError",
        "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 7.45 GiB for an array with "
        "shape (1000000000,) and data type float64",
        "RuntimeError: [enforce fail at alloc_cpu.cpp:114] data. DefaultCPUAllocator: not enough "
        "memory: you tried to allocate 68719476736 bytes.",
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
        "tensor with shape[50000,50000] and type float on /job:localhost/replica:0/task:0/device:"
        "CPU:0 by allocator cpu",
    ],
)
def test_host_memory_errors_are_a_nonzero_exit_that_says_host_memory(line):
    found = classify(exit_code=1, log_tail="loading\n" + line + "\n")
    assert found.failure is FailureClass.NONZERO_EXIT
    assert found.summary.startswith("exit code 1")
    assert "host out of memory" in found.summary
    assert found.evidence and found.evidence[-1] in line
    assert found.framework is None


@pytest.mark.parametrize(
    "log",
    [
        "[ 8123.441122] Out of memory: Killed process 1234 (python) total-vm:81234560kB\n",
        "[ 8123.440001] python invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP)"
        ", order=0, oom_score_adj=0\n",
        "Memory cgroup out of memory: Killed process 4242 (python) total-vm:1234kB\n",
    ],
)
def test_sigkill_with_the_kernel_oom_killer_in_the_log_is_host_memory(log):
    for code in (137, -9):
        found = classify(exit_code=code, log_tail="step 1 loss 2.0\n" + log)
        assert found.failure is FailureClass.SIGNAL
        assert "killed by signal SIGKILL (host out of memory?)" in found.summary
        assert found.evidence and found.evidence[-1] == log.strip().splitlines()[-1].strip()
        assert classify_failure(log) is None


@pytest.mark.parametrize("log", [
    "step 1 loss 2.0\nkilled 3 zombie workers\n",
    # The shell's words for any SIGKILL (a tester's `kill -9 $$` was called "host out of memory?").
    "/var/lib/rig/jobs/42/run.sh: line 3: 12345 Killed                  python train.py\n",
    "epoch 2\nKilled\n",
])
def test_sigkill_without_oom_killer_words_is_a_plain_signal(log):
    found = classify(exit_code=137, log_tail=log)
    assert found == Classification(FailureClass.SIGNAL, "killed by signal SIGKILL (exit 137)", ())


def test_kernel_oom_words_only_matter_for_sigkill():
    log = "Out of memory: Killed process 1234 (python)\n"
    assert classify(exit_code=143, log_tail=log).summary == "killed by signal SIGTERM (exit 143)"


# --- other CUDA errors -----------------------------------------------------------------------

CUDA_ERROR_CASES = [
    pytest.param(TORCH_TRACEBACK + "RuntimeError: CUDA error: an illegal memory access was "
                 "encountered\n" + TORCH_ASYNC_NOTE,
                 "CUDA error: an illegal memory access was encountered", id="illegal-access"),
    pytest.param("../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [3,0,0], "
                 "thread: [32,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && \"index out "
                 "of bounds\"` failed.\n"
                 "../aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [3,0,0], "
                 "thread: [33,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && \"index out "
                 "of bounds\"` failed.\n" + TORCH_TRACEBACK
                 + "RuntimeError: CUDA error: device-side assert triggered\n" + TORCH_ASYNC_NOTE,
                 "CUDA error: device-side assert triggered", id="device-side-assert"),
    pytest.param(TORCH_TRACEBACK + "RuntimeError: CUDA error: no kernel image is available for "
                 "execution on the device\n" + TORCH_ASYNC_NOTE,
                 "CUDA error: no kernel image is available for execution on the device",
                 id="no-kernel-image"),
    pytest.param(JAX_PREAMBLE + "2024-05-01 12:00:07.481516: E external/xla/xla/stream_executor/"
                 "cuda/cuda_driver.cc:1530] failed to synchronize the stop event: "
                 "CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure\n"
                 "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Failed to execute XLA Runtime "
                 "executable: run time error: custom call 'xla.gpu.func.launch' failed.\n",
                 "CUDA error: CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure",
                 id="driver-launch-failed"),
    pytest.param(CUPY_PREAMBLE + "cupy_backends.cuda.api.runtime.CUDARuntimeError: "
                 "cudaErrorIllegalAddress: an illegal memory access was encountered\n",
                 "CUDA error: cudaErrorIllegalAddress: an illegal memory access was encountered",
                 id="runtime-illegal-address"),
    pytest.param("Traceback (most recent call last):\n  File \"/home/ana/proj/train.py\", line 12,"
                 " in <module>\n    model.cuda()\n  File \"/opt/conda/lib/python3.11/site-packages/"
                 "torch/cuda/__init__.py\", line 319, in _lazy_init\n"
                 "    torch._C._cuda_init()\nRuntimeError: No CUDA GPUs are available\n",
                 "CUDA error: No CUDA GPUs are available", id="no-gpus"),
    pytest.param(TORCH_TRACEBACK + "RuntimeError: CUDA error: uncorrectable ECC error "
                 "encountered\n" + TORCH_ASYNC_NOTE,
                 "CUDA error: uncorrectable ECC error encountered", id="ecc"),
    pytest.param("2024-05-01 12:00:01.000000: E external/local_xla/xla/stream_executor/cuda/"
                 "cuda_driver.cc:282] failed call to cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable "
                 "device is detected\n", "CUDA error: CUDA_ERROR_NO_DEVICE: no CUDA-capable device "
                 "is detected", id="no-device"),
    pytest.param("Traceback (most recent call last):\n  File \"t.py\", line 2, in <module>\n"
                 "cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorInsufficientDriver: "
                 "CUDA driver version is insufficient for CUDA runtime version\n",
                 "CUDA error: cudaErrorInsufficientDriver: CUDA driver version is insufficient for "
                 "CUDA runtime version", id="old-driver"),
    pytest.param(TORCH_TRACEBACK + "RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED\n",
                 "CUDA error: CUDNN_STATUS_EXECUTION_FAILED", id="cudnn-exec-failed"),
]


@pytest.mark.parametrize(("log", "summary"), CUDA_ERROR_CASES)
def test_other_cuda_errors(log, summary):
    found = classify(exit_code=1, log_tail=log)
    assert found.failure is FailureClass.CUDA_ERROR
    assert found.summary == summary
    assert found.framework is None
    assert found.evidence and all(line in log for line in found.evidence)
    assert classify_failure(log) == found


def test_cuda_error_evidence_keeps_log_order():
    log = CUDA_ERROR_CASES[1].values[0]
    found = classify(exit_code=134, log_tail=log)
    assert found.evidence[-1] == "RuntimeError: CUDA error: device-side assert triggered"
    assert found.evidence[0].startswith("../aten/src/ATen/native/cuda/IndexKernel.cu:92")


# --- NCCL ------------------------------------------------------------------------------------

NCCL_DIST = (
    "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
    "ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
    "NCCL version 2.19.3"
)
NCCL_WATCHDOG = (
    "[rank0]:[E ProcessGroupNCCL.cpp:563] [Rank 0] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=1, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
    "600000 milliseconds before timing out."
)

NCCL_CASES = [
    pytest.param(NCCL_PREAMBLE + TORCH_TRACEBACK + NCCL_DIST + "\n"
                 "ncclUnhandledCudaError: Call to CUDA function failed.\n"
                 "Last error:\nCuda failure 'invalid device ordinal'\n",
                 "NCCL error: unhandled cuda error (NCCL 2.19.3)", id="dist-backend-error"),
    pytest.param(NCCL_PREAMBLE + "gpu-node-07:12345:12399 [0] NCCL INFO Connected all rings\n"
                 + TORCH_TRACEBACK + "ncclInternalError: Internal check failed.\n",
                 "NCCL error: ncclInternalError: Internal check failed.", id="internal"),
    pytest.param(NCCL_PREAMBLE + NCCL_WATCHDOG + "\n"
                 "[rank0]:[E ProcessGroupNCCL.cpp:1537] [PG 0 Rank 0] Timeout at NCCL work: 1, last "
                 "enqueued NCCL work: 1, last completed NCCL work: -1.\n"
                 "[rank0]:[E ProcessGroupNCCL.cpp:577] [Rank 0] Some NCCL operations have failed or "
                 "timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU "
                 "operations might run on corrupted/incomplete data.\n"
                 "[rank0]:[E ProcessGroupNCCL.cpp:583] [Rank 0] To avoid data inconsistency, we are "
                 "taking the entire process down.\n"
                 "terminate called after throwing an instance of 'c10::DistBackendError'\n",
                 "NCCL collective operation timed out (ALLREDUCE, after 600000 ms)", id="watchdog"),
    pytest.param("Traceback (most recent call last):\n  File \"ddp.py\", line 30, in <module>\n"
                 "    dist.all_reduce(t)\nRuntimeError: NCCL error in: /pytorch/torch/lib/c10d/"
                 "ProcessGroupNCCL.cpp:825, unhandled system error, NCCL version 2.7.8\n"
                 "ncclSystemError: System call (socket, malloc, munmap, etc) failed.\n",
                 "NCCL error: unhandled system error (NCCL 2.7.8)", id="torch-1.x-system"),
]


@pytest.mark.parametrize(("log", "summary"), NCCL_CASES)
def test_nccl_failures(log, summary):
    found = classify(exit_code=1, log_tail=log)
    assert found.failure is FailureClass.NCCL_ERROR
    assert found.summary == summary
    assert found.framework is None
    assert found.evidence and all(line in log for line in found.evidence)
    assert classify_failure(log) == found


def test_watchdog_timeout_kills_with_sigabrt_but_is_still_nccl():
    found = classify(exit_code=134, log_tail=NCCL_CASES[2].values[0] + "Aborted (core dumped)\n")
    assert found.failure is FailureClass.NCCL_ERROR
    assert found.evidence[0] == NCCL_WATCHDOG


def test_oom_beats_nccl_beats_cuda_error():
    oom_in_nccl = (NCCL_PREAMBLE + "gpu-node-07:12345:12399 [0] NCCL WARN Cuda failure 'out of "
                   "memory'\n" + NCCL_DIST + "\n")
    assert classify(exit_code=1, log_tail=oom_in_nccl).failure is FailureClass.CUDA_OOM
    cuda_then_nccl = (TORCH_TRACEBACK + "RuntimeError: CUDA error: an illegal memory access was "
                      "encountered\n" + NCCL_WATCHDOG + "\n")
    assert classify(exit_code=1, log_tail=cuda_then_nccl).failure is FailureClass.NCCL_ERROR
    nccl_then_oom = NCCL_DIST + "\n" + TORCH_TRACEBACK + TORCH_OOM_NEW + "\n"
    assert classify(exit_code=1, log_tail=nccl_then_oom).failure is FailureClass.CUDA_OOM


# --- facts: flags and exit codes -------------------------------------------------------------

def test_success_is_none_whatever_the_log_says():
    assert classify(exit_code=0) is None
    assert classify(exit_code=0, log_tail=TORCH_OOM_NEW) is None


@pytest.mark.parametrize(
    ("flags", "failure"),
    [
        ({"cancelled": True}, FailureClass.CANCELLED),
        ({"cancelled": True, "timed_out": True, "lost": True}, FailureClass.CANCELLED),
        ({"timed_out": True}, FailureClass.TIMEOUT),
        ({"timed_out": True, "lost": True}, FailureClass.TIMEOUT),
        ({"lost": True}, FailureClass.LOST),
    ],
)
@pytest.mark.parametrize("exit_code", [None, 0, 1, 137, 143, -15])
def test_flags_beat_exit_codes_and_log_text(flags, failure, exit_code):
    found = classify(exit_code=exit_code, log_tail=TORCH_TRACEBACK + TORCH_OOM_NEW, **flags)
    assert found.failure is failure
    assert found.evidence == ()
    assert found.framework is None
    assert found.summary and "\n" not in found.summary


@pytest.mark.parametrize(
    ("exit_code", "failure", "summary"),
    [
        (1, FailureClass.NONZERO_EXIT, "exit code 1"),
        (3, FailureClass.NONZERO_EXIT, "exit code 3"),
        (2, FailureClass.NONZERO_EXIT, "exit code 2"),
        (128, FailureClass.NONZERO_EXIT, "exit code 128"),
        (255, FailureClass.NONZERO_EXIT, "exit code 255"),
        # 126/127 alone: a program that ran and exited so (see test_cannot_start_needs_evidence)
        (127, FailureClass.NONZERO_EXIT, "exit code 127"),
        (126, FailureClass.NONZERO_EXIT, "exit code 126"),
        (137, FailureClass.SIGNAL, "killed by signal SIGKILL (exit 137)"),
        (143, FailureClass.SIGNAL, "killed by signal SIGTERM (exit 143)"),
        (134, FailureClass.SIGNAL, "killed by signal SIGABRT (exit 134)"),
        (139, FailureClass.SIGNAL, "killed by signal SIGSEGV (exit 139)"),
        (130, FailureClass.SIGNAL, "killed by signal SIGINT (exit 130)"),
        (-9, FailureClass.SIGNAL, "killed by signal SIGKILL (exit -9)"),
        (-11, FailureClass.SIGNAL, "killed by signal SIGSEGV (exit -11)"),
        (-200, FailureClass.NONZERO_EXIT, "exit code -200"),
        (None, FailureClass.NONZERO_EXIT, "ended without an exit code"),
    ],
)
def test_exit_code_facts(exit_code, failure, summary):
    log = "step 1 loss 2.0\nTraceback (most recent call last):\n  File \"t.py\", line 1\nboom\n"
    for tail in ("", log):
        assert classify(exit_code=exit_code, log_tail=tail) == Classification(failure, summary, ())


@pytest.mark.parametrize(("exit_code", "line", "summary"), [
    (127, "rig: command not found: trian.py (exit 127)", "command not found (exit 127)"),
    (126, "rig: not an executable file: /data/run.sh (exit 126)", "command not executable (exit 126)"),
    (127, "/bin/sh: 1: pyhton: not found", "command not found (exit 127)"),
    (127, "bash: pyhton: command not found", "command not found (exit 127)"),
    (126, "/bin/sh: 1: ./run.sh: Permission denied", "command not executable (exit 126)"),
])
def test_cannot_start_needs_evidence(exit_code, line, summary):
    """A command that could not start is said so by rig's wrapper or the shell; only then is
    126/127 COMMAND_NOT_FOUND (never retried). A program exiting 126/127 itself was retried."""
    found = classify(exit_code=exit_code, log_tail=f"some output\n{line}\n")
    assert found == Classification(FailureClass.COMMAND_NOT_FOUND, summary, (line,))
    ran = classify(exit_code=exit_code, log_tail="real program ran\n")
    assert ran is not None and ran.failure is FailureClass.NONZERO_EXIT
    handled = classify(exit_code=exit_code, log_tail=f"{line}\ntraining done\n")  # an earlier, handled one
    assert handled is not None and handled.failure is FailureClass.NONZERO_EXIT


def test_classification_is_frozen_and_the_enum_is_a_string():
    found = classify(exit_code=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        found.summary = "x"  # type: ignore[misc]
    assert FailureClass.CUDA_OOM == "cuda_oom"
    assert FailureClass("command_not_found") is FailureClass.COMMAND_NOT_FOUND
    assert {f.value for f in FailureClass} == {
        "nonzero_exit", "signal", "cuda_oom", "cuda_error", "nccl_error", "timeout", "cancelled",
        "lost", "command_not_found", "over_declaration", "start_failed", "bad_call", "bad_result",
        "invalid_record", "run_as_refused", "start_error", "unschedulable", "infrastructure"}


def test_classify_failure_is_log_only():
    assert classify_failure("") is None
    assert classify_failure("all good\n") is None
    assert classify_failure("Killed\n") is None
    assert classify_failure(TORCH_OOM_NEW).failure is FailureClass.CUDA_OOM


# --- a full 256 KiB tail ---------------------------------------------------------------------

def _noise(size: int) -> str:
    rng = random.Random(7)
    lines, total, step = [], 0, 0
    while total < size:
        step += 1
        line = (f"2024-05-01 12:{step % 60:02d}:{step % 59:02d} INFO train.py:88] step {step} "
                f"loss {rng.random():.4f} lr 3.0e-04 gpu memory usage: 12GB "
                f"{rng.random() * 2000:.1f} tok/s")
        if step % 97 == 0:
            line = "  File \"/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py\""
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)


def test_a_256_kib_tail_of_noise_with_the_oom_at_the_end():
    tail = (_noise(256 * 1024) + "\n" + TORCH_OOM_NEW + "\n")[-256 * 1024:]
    assert len(tail) == 256 * 1024
    found = classify(exit_code=1, log_tail=tail)
    assert found.failure is FailureClass.CUDA_OOM
    assert found.summary == "CUDA out of memory (PyTorch): tried to allocate 2.00 GiB"
    assert found.evidence == (TORCH_OOM_NEW[:300],)
    noise_only = _noise(256 * 1024)
    assert classify(exit_code=1, log_tail=noise_only).summary == "exit code 1"
    assert classify_failure(noise_only) is None


# --- read_tail -------------------------------------------------------------------------------

def test_read_tail_of_a_missing_file_is_empty(tmp_path):
    assert read_tail(tmp_path / "nope.log") == ""
    assert read_tail(str(tmp_path / "nope.log")) == ""
    assert read_tail(tmp_path / "nope.log" / "deeper") == ""


def test_read_tail_of_a_short_file_is_all_of_it(tmp_path):
    path = tmp_path / "job.log"
    path.write_text("line one\nline two\n", encoding="utf-8")
    assert read_tail(path) == "line one\nline two\n"
    assert read_tail(str(path)) == "line one\nline two\n"
    (tmp_path / "empty.log").write_bytes(b"")
    assert read_tail(tmp_path / "empty.log") == ""


def test_read_tail_of_a_long_file_is_its_last_bytes(tmp_path):
    path = tmp_path / "job.log"
    body = "".join(f"line {i:06d}\n" for i in range(100_000))  # 1.2 MB
    path.write_text(body + TORCH_OOM_NEW + "\n", encoding="utf-8")
    tail = read_tail(path)
    assert len(tail.encode()) == 256 * 1024
    assert tail.endswith(TORCH_OOM_NEW + "\n")
    assert read_tail(path, max_bytes=100) == (body + TORCH_OOM_NEW + "\n")[-100:]
    assert classify(exit_code=1, log_tail=tail).failure is FailureClass.CUDA_OOM


def test_read_tail_replaces_bad_bytes_and_drops_a_character_cut_in_half(tmp_path):
    path = tmp_path / "job.log"
    path.write_bytes("abc\u00e9\u20acxyz".encode() + b"\xff\n")  # é is 2 bytes, € is 3
    assert read_tail(path) == "abc\u00e9\u20acxyz\ufffd\n"
    assert read_tail(path, max_bytes=7) == "xyz\ufffd\n"  # the tail starts inside the €
    assert read_tail(path, max_bytes=0) == ""


# --- suggest_memory --------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("declared", "peak", "largest", "expected"),
    [
        (8 * GIB, None, 80 * GIB, 12 * GIB),  # 1.5x declared
        (7 * GIB, None, 80 * GIB, 11 * GIB),  # 10.5 GiB rounds up
        (10 * GIB + 1, None, 80 * GIB, 16 * GIB),  # a byte over rounds up a whole GiB
        (8 * GIB, 20 * GIB, 80 * GIB, 25 * GIB),  # peak * 1.25 beats 1.5x declared
        (8 * GIB, 9 * GIB, 80 * GIB, 12 * GIB),  # 1.5x declared beats peak * 1.25
        (8 * GIB, 20 * GIB + 300 * MIB, 80 * GIB, 26 * GIB),
        (60 * GIB, None, 80 * GIB, 80 * GIB),  # capped
        (60 * GIB, 79 * GIB, 79 * GIB + 512 * MIB, 79 * GIB + 512 * MIB),  # cap need not be whole
        (500 * MIB, None, 80 * GIB, 1 * GIB),
        (1, None, 80 * GIB, 1 * GIB),
    ],
)
def test_suggest_memory(declared, peak, largest, expected):
    got = suggest_memory(declared, peak, largest)
    assert got == expected
    assert isinstance(got, int)


def test_suggest_memory_margin_and_float_noise():
    assert suggest_memory(2 * GIB, 10 * GIB, 80 * GIB, margin=1.1) == 11 * GIB
    assert suggest_memory(2 * GIB, 10 * GIB, 80 * GIB, margin=2.0) == 20 * GIB
    with pytest.raises(ValueError):
        suggest_memory(-1, None, 80 * GIB)


# --- which error ended the job: a GPU message before a different final error ------------------

TORCHRUN_CHILD_OOM = """\
W0501 12:00:00.100000 140231 torch/distributed/run.py:793] Setting OMP_NUM_THREADS environment variable for each process to be 1 in default.
[rank0]: Traceback (most recent call last):
[rank0]:   File "/home/ana/proj/train.py", line 187, in main
[rank0]:     loss = model(batch).loss
[rank0]:   File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1747, in _call_impl
[rank0]:     return forward_call(*args, **kwargs)
[rank0]: {oom}
W0501 12:03:15.001000 140231 torch/distributed/elastic/multiprocessing/api.py:897] Sending process 12346 closing signal SIGTERM
E0501 12:03:15.123000 140231 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 0 (pid: 12345) of binary: /opt/conda/bin/python
Traceback (most recent call last):
  File "/opt/conda/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/opt/conda/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 263, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-05-01_12:03:15
  host      : gpu-node-07
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 12345)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""

HANDLED_OOM_TRACEBACK = """\
2024-05-01 12:03:11,482 ERROR train: batch 64 did not fit, halving it
Traceback (most recent call last):
  File "/home/ana/proj/train.py", line 120, in fit_batch
    loss = model(batch).loss
  File "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1747, in _call_impl
    return forward_call(*args, **kwargs)
{oom}
2024-05-01 12:03:12,002 INFO train: batch size now 32
Epoch 3:  43%|####3     | 215/500 [03:17<04:20,  1.09it/s, loss=2.30]
"""


@pytest.mark.parametrize("log", [
    pytest.param('checking: grep for CUDA out of memory in logs\nValueError: bad\n', id="echo-then-error"),
    pytest.param(HANDLED_OOM_TRACEBACK.format(oom=TORCH_OOM_NEW) + TORCH_TRACEBACK
                 + "ValueError: Expected input batch_size (32) to match target batch_size (16).\n",
                 id="handled-oom-traceback-then-another-error"),
    pytest.param(HANDLED_OOM_TRACEBACK.format(oom="RuntimeError: CUDA error: out of memory")
                 + "[rank0]: KeyError: 'labels'\n", id="handled-cuda-error-oom-then-keyerror"),
    pytest.param("retry 1: CUDA out of memory, trying again with batch 16\n" + TORCHRUN_CHILD_OOM.format(
        oom="AssertionError: shapes differ"), id="handled-oom-then-torchrun-child-error"),
])
def test_a_gpu_message_before_a_different_final_error_is_not_why_the_job_ended(log):
    """An OOM the job printed (echoed, logged and handled) before it failed of something else is no
    OOM: the job would be sent to the error queue and told to ask for more memory it does not need."""
    found = classify(exit_code=1, log_tail=log)
    assert found == Classification(FailureClass.NONZERO_EXIT, "exit code 1", ())
    assert classify_failure(log) is None


@pytest.mark.parametrize(("log", "summary"), [
    pytest.param(TORCHRUN_CHILD_OOM.format(oom=TORCH_OOM_NEW),
                 "CUDA out of memory (PyTorch): tried to allocate 2.00 GiB", id="torchrun-ranked"),
    pytest.param(TORCHRUN_CHILD_OOM.replace("[rank0]: ", "").format(oom=TORCH_OOM_NEW),
                 "CUDA out of memory (PyTorch): tried to allocate 2.00 GiB", id="torchrun-plain"),
    pytest.param(TORCHRUN_CHILD_OOM.format(oom="RuntimeError: CUDA error: out of memory"),
                 "CUDA out of memory (PyTorch)", id="torchrun-cuda-error-oom"),
    pytest.param("step 1 ok\n" + TORCH_TRACEBACK + TORCH_OOM_NEW + "\n", "CUDA out of memory (PyTorch): "
                 "tried to allocate 2.00 GiB", id="single-process"),
    pytest.param(HANDLED_OOM_TRACEBACK.format(oom=TORCH_OOM_OLD) + TORCH_TRACEBACK + TORCH_OOM_NEW + "\n",
                 "CUDA out of memory (PyTorch): tried to allocate 2.00 GiB", id="handled-oom-then-oom"),
    pytest.param(HANDLED_OOM_TRACEBACK.format(oom=TORCH_OOM_NEW)
                 + "\nThe above exception was the direct cause of the following exception:\n\n"
                 "Traceback (most recent call last):\n  File \"/home/ana/proj/train.py\", line 214, in <module>\n"
                 "    main()\nRuntimeError: training failed at step 2210\n",
                 "CUDA out of memory (PyTorch): tried to allocate 2.00 GiB", id="oom-is-the-cause"),
    pytest.param(HANDLED_OOM_TRACEBACK.format(oom=TORCH_OOM_NEW)
                 + "giving up: batch size 1 does not fit either\n",
                 "CUDA out of memory (PyTorch): tried to allocate 2.00 GiB", id="retry-loop-gives-up"),
    # An exception Python ignored at shutdown (a DataLoader's __del__ after the crash) is not
    # the final error: this read 'exit code 1' and was retried as it was.
    pytest.param("step 1 ok\n" + TORCH_TRACEBACK + TORCH_OOM_NEW + "\n"
                 "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f3c2a1b1ea0>\n"
                 "Traceback (most recent call last):\n"
                 '  File "/opt/conda/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1479, '
                 "in __del__\n    self._shutdown_workers()\n"
                 "AttributeError: 'NoneType' object has no attribute 'python_exit_status'\n",
                 "CUDA out of memory (PyTorch): tried to allocate 2.00 GiB", id="oom-then-ignored-del-error"),
    # Rank 0 (which hosts the store) ran out of memory; rank 1 then lost its connection to the
    # store before torchrun stopped it. Rank 1's error is not rank 0's: this read 'exit code 1'.
    pytest.param(TORCHRUN_CHILD_OOM.format(oom=TORCH_OOM_NEW.replace("\n", "\n[rank0]: ")).replace(
                 "W0501 12:03:15", "[rank1]: Traceback (most recent call last):\n[rank1]:   File \"/home/ana/proj/train.py\", "
                 "line 88, in <module>\n[rank1]:     dist.barrier()\n"
                 "[rank1]: torch.distributed.DistNetworkError: Connection reset by peer\nW0501 12:03:15"),
                 "CUDA out of memory (PyTorch): tried to allocate 2.00 GiB", id="torchrun-other-rank-store-lost"),
])
def test_an_oom_in_the_final_error_or_with_no_other_error_after_it_is_an_oom(log, summary):
    found = classify(exit_code=1, log_tail=log)
    assert found.failure is FailureClass.CUDA_OOM
    assert found.summary == summary
    assert classify_failure(log) == found


def test_an_oom_a_retry_loop_handled_before_a_clean_exit_is_success():
    log = HANDLED_OOM_TRACEBACK.format(oom=TORCH_OOM_NEW) + "training done, model saved\n"
    assert classify(exit_code=0, log_tail=log) is None


def test_a_256_kib_chain_of_tracebacks_is_read_in_well_under_a_second():
    """Finding the final error walks a chain of tracebacks back to its start; a 256 KiB tail of
    ~1,800 chained ones took 14 s when each step scanned the text from its start."""
    import time

    unit = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nValueError: x\n\n"
            "During handling of the above exception, another exception occurred:\n\n")
    first = unit.replace("ValueError: x", TORCH_OOM_NEW)
    tail = first + unit * (256 * 1024 // len(unit)) + "Traceback (most recent call last):\n  File \"x\"\nKeyError: 1\n"
    began = time.perf_counter()
    found = classify(exit_code=1, log_tail=tail)
    assert time.perf_counter() - began < 1.0
    assert found.failure is FailureClass.CUDA_OOM  # the chain goes back to it


def test_a_256_kib_tail_of_64_ranks_each_out_of_memory_is_read_once():
    """Each rank's lines are judged by that rank's final error; the log's exception lines are
    found in one pass, not once per rank (64 passes took ~270 ms on this tail, one ~10 ms)."""
    import time

    lines = [f"[rank{r}]: step {step} loss 1.0" for step in range(400) for r in range(64)]
    for r in range(64):
        lines += [f"[rank{r}]: Traceback (most recent call last):", f'[rank{r}]:   File "t.py", line 1, in <module>',
                  f"[rank{r}]: {TORCH_OOM_NEW}"]
    tail = "\n".join(lines)[-256 * 1024:]
    began = time.perf_counter()
    found = classify(exit_code=1, log_tail=tail)
    assert time.perf_counter() - began < 0.15
    assert found.failure is FailureClass.CUDA_OOM
