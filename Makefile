# Makefile - builds ./weft, runs the tests, the demo and the benchmarks.
# `make demo` and `make check` install missing Debian packages first (as root).

PREFIX   ?= /usr/local
CC       ?= cc
SANITIZE ?=
V        ?= 0

ifeq ($(SANITIZE),1)
  BUILD    ?= build/asan
  SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
else ifeq ($(SANITIZE),thread)
  BUILD    ?= build/tsan
  SANFLAGS := -fsanitize=thread
  export TSAN_OPTIONS := suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 $(TSAN_OPTIONS)
else
  BUILD    ?= build
  SANFLAGS :=
endif

CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration $(SANFLAGS)
CPPFLAGS += -Iinclude -Isrc -Ibackends -I$(BUILD)/grammar
LDFLAGS  += $(SANFLAGS)

# OpenBLAS, linked statically when its archive is installed so that ./weft
# runs where OpenBLAS is not. Only its BLAS part is used, which needs
# pthreads but not libgfortran (that is LAPACK's).
OPENBLAS_A := $(shell $(CC) -print-file-name=libopenblas.a)
ifeq ($(OPENBLAS_A),libopenblas.a)
  BLAS_LIBS := -lopenblas
else
  BLAS_LIBS := $(OPENBLAS_A) -lpthread
endif
# libffi calls native kernels (backends/cpu/native.c); static like OpenBLAS.
FFI_A := $(shell $(CC) -print-file-name=libffi.a)
ifeq ($(FFI_A),libffi.a)
  FFI_LIBS := -lffi
else
  FFI_LIBS := $(FFI_A)
endif
# Lua 5.4 runs the search's heuristics (src/script); static like OpenBLAS,
# so that ./weft runs where Lua is not installed.
LUA_CFLAGS := $(shell pkg-config --cflags lua5.4 2>/dev/null || echo -I/usr/include/lua5.4)
LUA_A := $(shell $(CC) -print-file-name=liblua5.4.a)
ifeq ($(LUA_A),liblua5.4.a)
  LUA_LIBS := -llua5.4
else
  LUA_LIBS := $(LUA_A)
endif
CPPFLAGS += $(LUA_CFLAGS)
LDLIBS   += $(LUA_LIBS) $(BLAS_LIBS) $(FFI_LIBS) -ldl -lm

# Debian packages the build and the tests need; `make deps` installs them.
# python3 runs test scripts; graphviz gives `dot` for `weft graph --dot`.
DEB_PACKAGES := build-essential flex bison pkg-config liblua5.4-dev libffi-dev \
                libopenblas-dev libcmocka-dev time librsvg2-bin libopenmpi-dev openmpi-bin \
                python3 graphviz

# The library: one folder per stage of the pipeline under src/ (the
# command line, src/cli, is not in it), its public headers in include/weft.
LIB_SRC    := $(filter-out src/cli/%,$(wildcard src/*/*.c))
CPU_SRC    := $(wildcard backends/*.c backends/cpu/*.c) backends/mpi/mpi_load.c
HEADERS    := $(wildcard include/weft/*.h src/*/*.h)
LIB_OBJ    := $(LIB_SRC:%.c=$(BUILD)/%.o) $(BUILD)/grammar/parser.o \
              $(BUILD)/grammar/lexer.o $(BUILD)/stdlib/embedded.o $(BUILD)/stdlib/heuristics.o \
              $(CPU_SRC:%.c=$(BUILD)/%.o)
MAIN_OBJ   := $(BUILD)/src/cli/main.o
STDLIB     := $(sort $(wildcard stdlib/*.plan))
HEURISTICS := $(sort $(wildcard stdlib/heuristics/*.lua))
UNIT_SRC   := $(wildcard tests/unit/test_*.c)
UNIT_BIN   := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)

.PHONY: all deps check layers-check search-check lua-check unit golden diag-coverage fuzz-check limits-check docs-check docs-examples install-check fmt-check examples-check mutate-check editors-check \
        fold-check calibrate run-check shards-check rendezvous-check reference-check deps-torch demo bench install fuzz fuzz-lua fuzz-lua-check clean \
        cuda cuda-emu cuda-check cuda-check-kernels cuda-check-runs gpu-pack
.DELETE_ON_ERROR:

all: weft

# The MPI plugin (backends/mpi): built with mpicc when it is installed, and
# loaded by `weft run` under mpirun, so that ./weft itself needs no MPI.
MPICC  ?= $(shell command -v mpicc 2>/dev/null)
MPI_SO := $(if $(MPICC),$(BUILD)/libweft_mpi.so)

# The CUDA plugin (backends/cuda): built with nvcc when it is found, for
# sm_80 and sm_90 with PTX, into $(BUILD)/cuda/libweft_cuda.so and copied
# beside ./weft, which loads it for `weft run --backend cuda`; cuBLASLt is
# found through the run path (the toolkit's, then beside the plugin), the
# CUDA runtime is linked in. The tests name the plugin they load
# (WEFT_PLUGIN_DIR): build/weft has none beside it.
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
# the toolkit nvcc runs from (it may be a wrapper elsewhere on the PATH)
CUDA_HOME ?= $(if $(NVCC),$(realpath $(or $(shell $(NVCC) -dryrun -c -x cu /dev/null -o /dev/null 2>&1 | \
               sed -n 's/^\#\$$ TOP=//p'),$(dir $(NVCC))/..)))
CUDA_SO   := $(if $(NVCC),$(BUILD)/cuda/libweft_cuda.so)
# NVTX's header-only library (backends/cuda/nvtx.c: the executor's ranges
# for Nsight Systems and Nsight Compute), in the toolkit's nvtx3 or the
# system's; without it the ranges are left out.
NVTX_H   := $(firstword $(wildcard $(if $(CUDA_HOME),$(CUDA_HOME)/include/nvtx3/nvToolsExt.h) /usr/include/nvtx3/nvToolsExt.h))
NVTX_INC := $(patsubst %/nvtx3/nvToolsExt.h,%,$(NVTX_H))
CUDA_CU   := $(wildcard backends/cuda/*.cu)
CUDA_C    := $(wildcard backends/cuda/*.c) backends/cpu/clip.c backends/mpi/mpi_load.c
CUDA_DEPS := $(wildcard backends/cuda/*.h backends/cuda/*.cuh) $(HEADERS)
NVCC_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 -Werror all-warnings
CUDA_CFLAGS := -O2 -g -std=c11 -D_GNU_SOURCE -fPIC -Wall -Wextra -Wno-unused-parameter -Werror \
               -Iinclude -Ibackends

ifeq ($(SANITIZE),)
weft: $(BUILD)/weft $(MPI_SO) $(CUDA_SO)
	@cp $(BUILD)/weft $@
	@$(if $(MPI_SO),cp $(MPI_SO) libweft_mpi.so)
	@$(if $(CUDA_SO),cp $(CUDA_SO) libweft_cuda.so)
else
weft: $(BUILD)/weft $(MPI_SO)
endif

cuda: $(CUDA_SO) $(if $(CUDA_SO),$(BUILD)/cuda/test_kernels $(BUILD)/cuda/bench_kernels $(BUILD)/cuda/cudnn_graphs \
      $(if $(NVTX_INC),$(BUILD)/cuda/libnvtx_record.so))

# What a GPU machine without flex, bison or Lua runs, as one file that the
# device tool can carry (unpacked they pass its 64 MiB): bench/gpu_session.sh
# unpacks it in the repository's root.
gpu-pack: weft cuda
	@test -n "$(CUDA_SO)" || { echo "make gpu-pack: needs nvcc"; exit 2; }
	tar -czf $(BUILD)/gpu-pack.tar.gz weft libweft_cuda.so $(BUILD)/cuda/test_kernels $(BUILD)/cuda/bench_kernels \
	  $(BUILD)/cuda/cudnn_graphs $(if $(NVTX_INC),$(BUILD)/cuda/libnvtx_record.so)
	@ls -l $(BUILD)/gpu-pack.tar.gz

$(BUILD)/cuda/%.o: backends/cuda/%.cu $(CUDA_DEPS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(NVCC_ARCH) -Xcompiler -fPIC,-Wall,-Wextra,-Wno-unused-parameter -Ibackends -c -o $@ $<

# Hopper's warpgroup products (wgmma) exist on sm_90a alone, whose code runs
# on compute capability 9.0 only: attention_wg.cu is built for it alone and
# its kernels launched only there.
$(BUILD)/cuda/attention_wg.o: NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a

$(BUILD)/cuda/host/%.o: backends/cuda/%.c $(CUDA_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) -c -o $@ $<

$(BUILD)/cuda/host/clip.o: backends/cpu/clip.c backends/cpu/clip.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) -c -o $@ $<

$(BUILD)/cuda/host/mpi_load.o: backends/mpi/mpi_load.c backends/mpi/mpi_load.h backends/mpi/weft_mpi.h
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) -c -o $@ $<

# NCCL (backends/cuda/ccl.cu) where nccl.h is, in the toolkit or the
# system's; found at run time like cuBLASLt, through the run path. Without
# it the plugin builds with no NCCL path (WEFT_NO_NCCL).
NCCL_H      := $(firstword $(wildcard $(if $(CUDA_HOME),$(CUDA_HOME)/include/nccl.h) /usr/include/nccl.h))
NCCL_LIBDIR := $(if $(NCCL_H),$(patsubst %/,%,$(dir $(firstword $(wildcard $(if $(CUDA_HOME),$(CUDA_HOME)/lib/libnccl.so \
                 $(CUDA_HOME)/lib64/libnccl.so $(CUDA_HOME)/targets/x86_64-linux/lib/libnccl.so) \
                 /usr/lib/x86_64-linux-gnu/libnccl.so)))))
NCCL_LIBS   := $(if $(NCCL_LIBDIR),-L$(NCCL_LIBDIR) -lnccl)
$(BUILD)/cuda/ccl.o: NVCCFLAGS += $(if $(NCCL_LIBDIR),-I$(dir $(NCCL_H)),-DWEFT_NO_NCCL)

# cuDNN's headers (backends/cuda/attention_cudnn.cu, WEFT_ATTN=cudnn): the
# library itself is loaded at run time with dlopen, never linked. Without
# the headers that path is left out (WEFT_NO_CUDNN).
CUDNN_H := $(firstword $(wildcard $(if $(CUDA_HOME),$(CUDA_HOME)/include/cudnn_graph.h) /usr/include/cudnn_graph.h \
             /usr/include/x86_64-linux-gnu/cudnn_graph.h))
$(BUILD)/cuda/attention_cudnn.o: NVCCFLAGS += $(if $(CUDNN_H),-I$(dir $(CUDNN_H)),-DWEFT_NO_CUDNN)

NVTX_FLAGS := $(if $(NVTX_INC),-DWEFT_NVTX -isystem $(NVTX_INC))
$(BUILD)/cuda/host/nvtx.o: CUDA_CFLAGS += $(NVTX_FLAGS)

$(BUILD)/cuda/libweft_cuda.so: $(CUDA_CU:backends/cuda/%.cu=$(BUILD)/cuda/%.o) $(patsubst %.c,$(BUILD)/cuda/host/%.o,$(notdir $(CUDA_C)))
	$(NVCC) -shared -o $@ $^ -lcublasLt $(NCCL_LIBS) -Xlinker --no-undefined \
	  -Xlinker -rpath,$(CUDA_HOME)/lib64:$(CUDA_HOME)/targets/x86_64-linux/lib:/usr/local/cuda/lib64$(if $(NCCL_LIBDIR),:$(NCCL_LIBDIR)):'$$ORIGIN'

# The kernels against the CPU backend's (tests/cuda/test_kernels.c), built
# with the plugin to run where a GPU is (tests/gpu/run.sh); `make cuda`
# builds both.
$(BUILD)/cuda/test_kernels: tests/cuda/test_kernels.c $(CUDA_SO) $(BUILD)/libweft.a
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -L$(BUILD)/cuda -lweft_cuda -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../..' $(BUILD)/libweft.a \
	  $(LDLIBS)

# Whether cuDNN takes attention_cudnn.cu's graphs for an H100, asked
# without a GPU through cuDNN's device properties (tests/cuda/cudnn_graphs.c).
$(BUILD)/cuda/cudnn_graphs: tests/cuda/cudnn_graphs.c $(CUDA_SO)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -L$(BUILD)/cuda -lweft_cuda -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../..' $(LDLIBS)

# The attention kernels and a cuBLASLt linear timed with CUDA events
# (tests/cuda/bench_kernels.c; bench/gpu.sh runs it first).
$(BUILD)/cuda/bench_kernels: tests/cuda/bench_kernels.c $(CUDA_SO)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -L$(BUILD)/cuda -lweft_cuda -Wl,-rpath,'$$ORIGIN:$$ORIGIN/../..' $(LDLIBS)

# The same sources for the CPU emulation of a GPU (backends/cuda/emu.h): a
# C++ compiler and no CUDA, so that make check runs the kernels and the
# executor everywhere.
CXX ?= g++
EMU := $(BUILD)/cudaemu
$(EMU)/host/nvtx.o: CUDA_CFLAGS += $(NVTX_FLAGS)
EMU_CXXFLAGS := -O2 -fvect-cost-model=dynamic -g -std=c++17 -fPIC -DWEFT_CUDA_EMU -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas \
                -Werror -Ibackends $(SANFLAGS)

cuda-emu: $(EMU)/libweft_cuda.so $(EMU)/test_kernels $(EMU)/bench_kernels $(EMU)/test_emu \
          $(if $(NVTX_INC),$(EMU)/libnvtx_record.so)

$(EMU)/%.o: backends/cuda/%.cu $(CUDA_DEPS)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -x c++ -c -o $@ $<

$(EMU)/emu.o: backends/cuda/emu.cc backends/cuda/emu.h
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c -o $@ $<

$(EMU)/host/%.o: backends/cuda/%.c $(CUDA_DEPS)
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) -DWEFT_CUDA_EMU $(SANFLAGS) -c -o $@ $<

$(EMU)/host/clip.o: backends/cpu/clip.c backends/cpu/clip.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) -DWEFT_CUDA_EMU $(SANFLAGS) -c -o $@ $<

$(EMU)/host/mpi_load.o: backends/mpi/mpi_load.c backends/mpi/mpi_load.h backends/mpi/weft_mpi.h
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) -DWEFT_CUDA_EMU $(SANFLAGS) -c -o $@ $<

$(EMU)/libweft_cuda.so: $(CUDA_CU:backends/cuda/%.cu=$(EMU)/%.o) $(EMU)/emu.o $(patsubst %.c,$(EMU)/host/%.o,$(notdir $(CUDA_C)))
	$(CXX) -shared $(SANFLAGS) -o $@ $^ -Wl,--no-undefined -lm

$(EMU)/test_kernels: tests/cuda/test_kernels.c $(EMU)/libweft_cuda.so $(BUILD)/libweft.a
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -L$(EMU) -lweft_cuda -Wl,-rpath,'$$ORIGIN' $(BUILD)/libweft.a $(LDFLAGS) $(LDLIBS)

# the emulation on its own (tests/cuda/test_emu.cc)
$(EMU)/test_emu: tests/cuda/test_emu.cc $(EMU)/libweft_cuda.so $(CUDA_DEPS)
	$(CXX) $(EMU_CXXFLAGS) -o $@ $< -L$(EMU) -lweft_cuda -Wl,-rpath,'$$ORIGIN'

# a profiler's stand-in that writes the NVTX ranges it is given
# (tests/cuda/nvtx_record.c, loaded through NVTX_INJECTION64_PATH)
$(EMU)/libnvtx_record.so $(BUILD)/cuda/libnvtx_record.so: tests/cuda/nvtx_record.c
	@mkdir -p $(dir $@)
	$(CC) $(CUDA_CFLAGS) -shared -isystem $(NVTX_INC) -o $@ $<

$(EMU)/bench_kernels: tests/cuda/bench_kernels.c $(EMU)/libweft_cuda.so
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< -L$(EMU) -lweft_cuda -Wl,-rpath,'$$ORIGIN' $(LDFLAGS) $(LDLIBS)

$(BUILD)/libweft_mpi.so: backends/mpi/weft_mpi.c backends/mpi/weft_mpi.h
	@mkdir -p $(dir $@)
	$(MPICC) -shared -fPIC -O2 -Wall -Wextra -o $@ $<

$(BUILD)/weft: $(MAIN_OBJ) $(BUILD)/libweft.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libweft.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/src/%.o: src/%.c $(BUILD)/grammar/parser.h $(HEADERS) $(wildcard backends/cpu/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/backends/%.o: backends/%.c $(wildcard backends/cpu/*.h) backends/mpi/weft_mpi.h $(HEADERS)
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

$(BUILD)/grammar/parser.c $(BUILD)/grammar/parser.h: grammar/parser.y
	@mkdir -p $(dir $@)
	bison -Wall -Wno-yacc --defines=$(BUILD)/grammar/parser.h -o $(BUILD)/grammar/parser.c $<

$(BUILD)/grammar/lexer.c $(BUILD)/grammar/lexer.h: grammar/lexer.l $(BUILD)/grammar/parser.h
	@mkdir -p $(dir $@)
	flex --header-file=$(BUILD)/grammar/lexer.h -o $(BUILD)/grammar/lexer.c $<

# Generated code is not held to -Wextra.
$(BUILD)/grammar/%.o: $(BUILD)/grammar/%.c $(BUILD)/grammar/parser.h $(BUILD)/grammar/lexer.h $(HEADERS)
	$(CC) $(CPPFLAGS) $(CFLAGS) -Wno-sign-compare -Wno-unused-function -c -o $@ $<

# The standard library is compiled into the binary.
$(BUILD)/stdlib/embed: stdlib/embed.c
	@mkdir -p $(dir $@)
	$(CC) -O1 -o $@ $<

$(BUILD)/stdlib/embedded.c: $(BUILD)/stdlib/embed $(STDLIB)
	$(BUILD)/stdlib/embed $(STDLIB) > $@

$(BUILD)/stdlib/embedded.o: $(BUILD)/stdlib/embedded.c
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# The heuristics of stdlib/heuristics (weft search --heuristic NAME) too.
$(BUILD)/stdlib/heuristics.c: $(BUILD)/stdlib/embed $(HEURISTICS)
	$(BUILD)/stdlib/embed -t heuristic -i script/heuristic_files.h $(HEURISTICS) > $@

$(BUILD)/stdlib/heuristics.o: $(BUILD)/stdlib/heuristics.c src/script/heuristic_files.h
	$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<

# ---- tests -----------------------------------------------------------------

$(BUILD)/tests/%: tests/unit/%.c tests/unit/unit.h $(BUILD)/libweft.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< $(BUILD)/libweft.a $(LDFLAGS) -lcmocka $(LDLIBS)

# the CUDA backend's planning, which needs no GPU (backends/cuda/cx.c, sched.c)
$(BUILD)/tests/test_cuda_plan: tests/unit/test_cuda_plan.c backends/cuda/cx.c backends/cuda/sched.c $(CUDA_DEPS) $(BUILD)/libweft.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< backends/cuda/cx.c backends/cuda/sched.c $(BUILD)/libweft.a $(LDFLAGS) -lcmocka $(LDLIBS)

# one process of the NCCL rendezvous (backends/cuda/rendezvous.c), host C
$(BUILD)/tests/test_rendezvous: tests/cuda/test_rendezvous.c backends/cuda/rendezvous.c backends/cuda/rendezvous.h backends/mpi/mpi_load.c \
                                backends/mpi/weft_mpi.h
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< backends/cuda/rendezvous.c backends/mpi/mpi_load.c $(LDFLAGS) -ldl

# The suites, the longest first: the two halves of cuda-check (its
# emulated kernels and plans; its runs of the executor's switches and
# processes) and then the rest.
CHECK_SUITES := cuda-check-kernels cuda-check-runs run-check docs-examples golden examples-check fold-check \
                fuzz-lua-check mutate-check search-check symbolic-check lua-check unit shards-check \
                layers-check diag-coverage fuzz-check limits-check docs-check install-check fmt-check editors-check \
                calibrate reference-check rendezvous-check
# make check: the builds, then the suites, both on every core (unless make
# was given -j itself), each suite's output together once it ends
# (--output-sync), its seconds in $(BUILD)/check-times and the slowest said
# at the end
NPROC := $(shell nproc 2>/dev/null || echo 1)
CHECK_JOBS = $(if $(filter -j% j%,$(MAKEFLAGS)),,-j$(NPROC))
# make -n: the suites' makes print what they would run, and nothing is timed
DRY_RUN = $(findstring n,$(firstword -$(MAKEFLAGS)))

check: deps
	@$(MAKE) --no-print-directory $(CHECK_JOBS) weft $(UNIT_BIN) $(FUZZ_BIN) $(BUILD)/tests/test_rendezvous cuda-emu \
	  $(if $(CUDA_SO),$(BUILD)/cuda/cudnn_graphs)
	@$(if $(DRY_RUN),$(MAKE) --no-print-directory $(CHECK_SUITES:%=timed-%); exit 0;) \
	mkdir -p $(BUILD) && : > $(BUILD)/check-times && start=$$(date +%s) && \
	$(MAKE) --no-print-directory $(CHECK_JOBS) --output-sync=target $(CHECK_SUITES:%=timed-%) && \
	echo "make check: all suites passed in $$(( $$(date +%s) - start )) s; the slowest:" \
	  "$$(sort -rn $(BUILD)/check-times | head -6 | awk '{printf "%s%s %d s", (NR > 1 ? ", " : ""), $$2, $$1}')"

timed-%:
	@s=$$(date +%s) && $(MAKE) --no-print-directory $* $(if $(DRY_RUN),,&& echo "$$(( $$(date +%s) - s )) $*" >> $(BUILD)/check-times)

# the pipeline is one-way: no header of a later stage, no include cycle
layers-check:
	@python3 tests/layers_check.py

unit: $(UNIT_BIN)
	@sh tests/run_unit.sh $(UNIT_BIN)

golden: weft
	@sh tests/golden/run.sh $(BUILD)/weft

diag-coverage:
	@sh tests/diag_coverage.sh

# huge settings and files that would block are answered at once
# (tests/limits_check.sh: within 5 s and 1 GB)
limits-check: weft
	@LIMITS_NO_ULIMIT=$(SANITIZE) sh tests/limits_check.sh $(BUILD)/weft

# the ```weft examples of the docs pass `weft check`
docs-check: weft
	@sh tests/docs_check.sh $(BUILD)/weft README.md docs/*.md

# the commands of the docs print what the docs say (tests/docs_examples.py)
docs-examples: weft
	@python3 tests/docs_examples.py $(BUILD)/weft README.md docs/*.md

# make install puts weft where it finds its MPI plugin (tests/install_check.sh)
install-check: weft
ifeq ($(SANITIZE),)
	@sh tests/install_check.sh "$(MAKE)" $(MPI_SO)
else
	@echo "install-check: skipped with SANITIZE (make install installs the plain build)"
endif

fmt-check: weft
	@sh tests/fmt_check.sh $(BUILD)/weft

examples-check: weft
	@sh tests/examples_check.sh $(BUILD)/weft

fold-check: weft
	@sh tests/fold_check.sh $(BUILD)/weft

mutate-check: weft
	@sh tests/mutate_check.sh $(BUILD)/weft

# weft estimate against published throughput (docs/estimate.md#accuracy)
calibrate: weft
	@CALIBRATE_NO_ULIMIT=$(SANITIZE) sh tests/estimate/calibrate.sh $(BUILD)/weft

# --cost symbolic orders plans as the roofline does (docs/estimate.md)
symbolic-check: weft
	@sh tests/symbolic_order.sh $(BUILD)/weft

# weft search against Megatron-LM's published configurations
search-check: weft
	@sh tests/search_check.sh $(BUILD)/weft

# weft search --heuristic: megatron.lua against the megatron strategy,
# weft.estimate, heuristics that steer the search, the sandbox's limits
lua-check: weft
	@SANITIZE=$(SANITIZE) sh tests/lua_check.sh $(BUILD)/weft

# weft run against a GPT-2 written in PyTorch (skipped without PyTorch;
# `make deps-torch` installs Debian's)
reference-check: weft
	@sh tests/reference/run.sh $(BUILD)/weft

deps-torch:
	@/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null || \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch python3-numpy; }

# weft run: every example matches one device, resume, mpirun, checkpoints
run-check: weft
	@sh tests/run_check.sh $(BUILD)/weft

# sharded checkpoints: saved by 4 processes, resumed under other plans by
# 2 and by 1; killed while saving, the previous set stays whole
shards-check: weft
	@sh tests/shards_check.sh $(BUILD)/weft

editors-check:
	@sh tests/editors_check.sh

# the rendezvous of NCCL communicators, without a GPU: through a file
# (writer and readers agree; readers time out cleanly) and through MPI
rendezvous-check: $(BUILD)/tests/test_rendezvous $(MPI_SO)
	@sh tests/rendezvous_check.sh $(BUILD)/tests/test_rendezvous $(if $(MPI_SO),$(BUILD))

# the CUDA backend without a GPU: the plugin loads and lists its kernels and
# says there is no device; the emulated GPU runs every kernel against the
# CPU's and the example plans against one device (tests/cuda_check.sh)
# (in two halves for make check, which runs them side by side)
cuda-check cuda-check-kernels cuda-check-runs: weft cuda-emu $(if $(CUDA_SO),$(BUILD)/cuda/cudnn_graphs)
	@CUDA_CHECK_PART=$(patsubst cuda-check-%,%,$(filter cuda-check-%,$@)) \
	  sh tests/cuda_check.sh $(BUILD)/weft $(EMU) $(if $(CUDA_SO),$(BUILD)/cuda)

deps:
	@sh tests/deps.sh $(DEB_PACKAGES)

demo: deps
	@$(MAKE) --no-print-directory weft
	@sh examples/demo.sh ./weft

bench: weft
	@sh bench/run.sh ./weft
	@sh bench/run_cpu.sh ./weft

# weft in bin/; the MPI plugin in lib/weft/, where weft looks for it when
# it is not beside the binary (backends/cpu/net.c); the standard library's
# source in share/weft/stdlib/ (weft has it built in; --stdlib reads a copy).
install: weft
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/weft/stdlib
	install -m 755 weft $(DESTDIR)$(PREFIX)/bin/weft
	install -m 644 $(STDLIB) $(DESTDIR)$(PREFIX)/share/weft/stdlib/
	install -d $(DESTDIR)$(PREFIX)/share/weft/stdlib/heuristics
	install -m 644 $(HEURISTICS) $(DESTDIR)$(PREFIX)/share/weft/stdlib/heuristics/
ifneq ($(MPI_SO),)
	install -d $(DESTDIR)$(PREFIX)/lib/weft
	install -m 755 $(MPI_SO) $(DESTDIR)$(PREFIX)/lib/weft/libweft_mpi.so
endif
ifneq ($(CUDA_SO),)
	install -d $(DESTDIR)$(PREFIX)/lib/weft
	install -m 755 $(CUDA_SO) $(DESTDIR)$(PREFIX)/lib/weft/libweft_cuda.so
endif

# libFuzzer targets (tests/fuzz/fuzz_NAME.c, seeds in tests/fuzz/seeds/NAME):
# check (parser, evaluator, plans, fmt), lower (lowering, validation, the
# simulator and every printer), safetensors (the reader and what weft run
# checks of checkpoints and inputs), set (--set values through plans).
# FUZZ_SECONDS bounds each target's run; FUZZ_TARGETS picks some. An input
# that runs for more than 30 s under the sanitizers (about 3 s without
# them) is reported: legal plans of a few thousand layers take seconds.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= check lower safetensors set
fuzz:
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang \
	  SANFLAGS="-fsanitize=fuzzer-no-link,address,undefined" build/fuzz/libweft.a
	@for t in $(FUZZ_TARGETS); do \
	  clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude -Isrc -Ibackends \
	    -o build/fuzz/fuzz_$$t \
	    tests/fuzz/fuzz_$$t.c build/fuzz/libweft.a $(LDLIBS) || exit 1; \
	  mkdir -p build/fuzz/corpus/$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  build/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=30 -rss_limit_mb=2048 \
	    build/fuzz/corpus/$$t tests/fuzz/seeds/$$t || exit 1; \
	done

# the fuzz targets without libFuzzer: each replays its seeds and fixed
# variants of them (tests/fuzz/replay.c); a crash fails make check
FUZZ_BIN := $(FUZZ_TARGETS:%=$(BUILD)/tests/fuzz_%)
fuzz-check: $(FUZZ_BIN)
	@for t in $(FUZZ_TARGETS); do \
	  printf 'fuzz-check: %s: ' $$t; $(BUILD)/tests/fuzz_$$t tests/fuzz/seeds/$$t || exit 1; \
	done

$(BUILD)/tests/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(BUILD)/libweft.a
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -o $@ $< tests/fuzz/replay.c $(BUILD)/libweft.a $(LDFLAGS) $(LDLIBS)

# The same, short, as make check runs it (when clang is installed): only
# the script stage is instrumented, over the plain library, so that it
# builds in seconds.
LUA_FUZZ_SECONDS ?= 20
fuzz-lua-check:
ifeq ($(shell command -v clang 2>/dev/null),)
	@echo "fuzz-lua-check: skipped (no clang)"
else
	@$(MAKE) -s --no-print-directory SANITIZE= build/libweft.a
	@mkdir -p build/fuzz-check/corpus
	@rm -rf build/fuzz-check/seeds && mkdir -p build/fuzz-check/seeds && \
	  cp tests/golden/lua/*.lua tests/lua/*.lua tests/fuzz/lua_seeds/*.lua build/fuzz-check/seeds/
	@clang -O1 -g -fsanitize=fuzzer,address,undefined -Iinclude -Isrc $(LUA_CFLAGS) -o build/fuzz-check/fuzz_lua \
	  tests/fuzz/fuzz_lua.c src/script/*.c build/libweft.a $(LUA_LIBS) $(BLAS_LIBS) $(FFI_LIBS) -ldl -lm -lpthread
	@build/fuzz-check/fuzz_lua -max_total_time=$(LUA_FUZZ_SECONDS) -max_len=8192 -timeout=20 -rss_limit_mb=1024 \
	  build/fuzz-check/corpus stdlib/heuristics build/fuzz-check/seeds >build/fuzz-check/log 2>&1 || \
	  { tail -60 build/fuzz-check/log; exit 1; }
	@grep -o 'Done [0-9]* runs in [0-9]* second(s)' build/fuzz-check/log | sed 's/^/fuzz-lua-check: /'
endif

# libFuzzer over Lua heuristics (tests/fuzz/fuzz_lua.c): any script, in the
# sandbox, steering the search of a small model; seeded with the standard
# library's heuristics, the Lua scripts of the tests (tests/golden/lua,
# tests/lua) and tests/fuzz/lua_seeds.
fuzz-lua:
	@$(MAKE) --no-print-directory BUILD=build/fuzz CC=clang \
	  SANFLAGS="-fsanitize=fuzzer-no-link,address,undefined" build/fuzz/libweft.a
	clang -fsanitize=fuzzer,address,undefined -Iinclude -Isrc $(LUA_CFLAGS) -o build/fuzz/fuzz_lua \
	  tests/fuzz/fuzz_lua.c build/fuzz/libweft.a $(LUA_LIBS) $(BLAS_LIBS) $(FFI_LIBS) -ldl -lm
	@mkdir -p build/fuzz/lua_corpus
	@rm -rf build/fuzz/lua_seeds && mkdir -p build/fuzz/lua_seeds && \
	  cp tests/golden/lua/*.lua tests/lua/*.lua tests/fuzz/lua_seeds/*.lua build/fuzz/lua_seeds/
	build/fuzz/fuzz_lua -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -timeout=20 -rss_limit_mb=1024 \
	  build/fuzz/lua_corpus stdlib/heuristics build/fuzz/lua_seeds

clean:
	rm -rf build weft libweft_mpi.so libweft_cuda.so
