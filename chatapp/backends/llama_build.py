"""The llama-cpp-python build specchat wants, as one command (the README's install step).

From source for this CPU, with llama.cpp's RPC backend (a target on other machines) and without
its AMX kernels (they crash on Xeons with AMX, llama.cpp issue 20824). ``--no-cache-dir`` and
``--force-reinstall`` make pip build it anew instead of reusing a wheel built another way.
"""

NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
FULL_BUILD_COMMAND = (
    f"CMAKE_ARGS=\"-DGGML_RPC=on -DCMAKE_C_FLAGS='{NO_AMX_FLAGS}' "
    f"-DCMAKE_CXX_FLAGS='{NO_AMX_FLAGS}'\" pip install --no-cache-dir --force-reinstall "
    "--no-binary llama-cpp-python llama-cpp-python==0.3.36")
