"""tvm_fusion: operator fusion for Apache TVM (Relax + TE), ONNX in, fused CUDA libraries out."""

from setuptools import find_packages, setup

#: MetaSchedule tuning (`compile --tune`): its builder and runner workers pickle with cloudpickle; its default
#: cost model is XGBoost
TUNE = ["cloudpickle>=3", "xgboost>=2"]

setup(
    name="tvm_fusion",
    version="0.1.0",
    description="Operator-fusion compiler plugin for Apache TVM: ONNX -> fused Relax -> CUDA library",
    python_requires=">=3.10",
    packages=find_packages(include=["tvm_fusion", "tvm_fusion.*"]),
    package_data={"tvm_fusion.deploy": ["thread_pool.c"], "tvm_fusion.patterns": ["README.md"]},
    install_requires=[
        "apache-tvm==0.27.0.post1",
        # 0.1.15.post2 (what pip picks for apache-tvm's >=0.1.14.post0) segfaults in ffi::ToJSONGraph on
        # tvm.ir.save_json, which breaks MetaSchedule and Schedule.tensorize; tests/test_tvm_ffi.py guards it
        "apache-tvm-ffi==0.1.14.post0",
        "onnx==1.23.2",
        "onnxruntime==1.32.0",
        "onnxslim==0.1.98",  # the front door (simplify.py); onnxsim and onnxscript are compared in benchmarks/
        "numpy>=1.26",
        "ml_dtypes>=0.5",  # bfloat16 arrays (precision.numpy_dtype); apache-tvm needs it too
        "tqdm>=4.66",
        "graphviz>=0.20",  # profile --html: the model graph (also needs Graphviz's `dot` program)
    ],
    extras_require={
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",
            "hypothesis>=6.100",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            "jupytext>=1.16",
            "nvidia-cuda-cuobjdump>=13",  # lists the kernels of exported fatbins (tests/cuda_stub)
            "cuda-bindings>=13,<14",  # the NVRTC path is tested too
            "nvidia-cuda-nvrtc>=13,<14",
            *TUNE,
        ],
        "tune": TUNE,
        # NVRTC, for building CUDA libraries on a host without nvcc on PATH (TVM's NVRTC path still wants
        # the CUDA headers: CUDA_PATH or /usr/local/cuda)
        "cuda": ["cuda-bindings>=13,<14", "nvidia-cuda-nvrtc>=13,<14"],
    },
    entry_points={"console_scripts": ["tvm-fusion=tvm_fusion.cli:main"]},
)
