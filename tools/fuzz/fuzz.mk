# Builds the libFuzzer binaries with clang (+ ASan + UBSan); used by tools/fuzz/run.sh, which runs
#   make -f tools/fuzz/fuzz.mk BUILD=<dir> <dir>/safetensors_fuzzer <dir>/quant_state_fuzzer
# from the repository root. Incremental (header dependencies through -MMD).
CXX := clang++
BUILD ?= /tmp/dbrq-fuzz
LIB_SRCS := $(wildcard runtime/*.cc kernels/*.cc quant_state/*.cc tracer/*.cc) tools/fuzz/fuzz_targets.cc
SAN := -fsanitize=address,undefined -fno-sanitize-recover=all
# libdnnl (Debian) uses libgomp: clang must target it too, not its own libomp.
CXXFLAGS := -std=c++17 -O1 -g -fno-omit-frame-pointer -march=native -fopenmp=libgomp $(SAN) \
            -fsanitize=fuzzer-no-link -I. -DSPDLOG_SHARED_LIB -DSPDLOG_COMPILED_LIB -DSPDLOG_FMT_EXTERNAL \
            -Wno-unused-command-line-argument -MMD -MP
ABSL := flags_parse flags_usage flags_usage_internal flags_internal flags_marshalling flags_reflection \
        flags_config flags_program_name flags_private_handle_accessor flags_commandlineflag \
        flags_commandlineflag_internal raw_hash_set hash city low_level_hash synchronization \
        graphcycles_internal stacktrace symbolize debugging_internal demangle_internal malloc_internal \
        time civil_time time_zone str_format_internal strings strings_internal int128 throw_delegate \
        bad_optional_access bad_variant_access base spinlock_wait raw_logging_internal log_severity
LIBS := -ldnnl -lspdlog -lfmt $(addprefix -labsl_,$(ABSL)) -lgomp -lpthread
LIB_OBJS := $(LIB_SRCS:%.cc=$(BUILD)/obj/%.o)

$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	@echo "  CXX $<"
	@$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/%_fuzzer: $(BUILD)/obj/tools/fuzz/%_fuzzer.o $(LIB_OBJS)
	@echo "  LINK $@"
	@$(CXX) -fsanitize=fuzzer $(SAN) -fopenmp=libgomp $^ -o $@ $(LIBS)

.SECONDARY:
-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
