# The real model (SmolLM2-135M-Instruct, GGUF) against an independent implementation: the
# fixture converts the file with the gguf package and runs mlx-lm's Llama on it (tests/model/);
# the test runs `metrale-gpu run --model` teacher-forced on the CPU backend and compares every
# step's logits. Sanitizer builds run one case (the loader and the pass under ASan/UBSan), the
# normal build all four.
if(METRALE_SANITIZE)
  set(smollm2_cases 1)
else()
  set(smollm2_cases 4)
endif()
add_test(NAME smollm2_reference_files
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/model/setup.sh ${PROJECT_BINARY_DIR}/smollm2_reference
                 ${smollm2_cases})
set_tests_properties(smollm2_reference_files PROPERTIES FIXTURES_SETUP smollm2_reference TIMEOUT 1500)
add_test(NAME smollm2_vs_mlx_lm
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/model/compare.sh $<TARGET_FILE:metrale-gpu>
                 ${PROJECT_BINARY_DIR}/smollm2_reference cpu ${smollm2_cases})
set_tests_properties(smollm2_vs_mlx_lm PROPERTIES FIXTURES_REQUIRED smollm2_reference
                     SKIP_RETURN_CODE 77 TIMEOUT 1200)

# Tensor parallelism on the real model: SmolLM2-135M (MLX-quantized matrices from the GGUF file)
# split over 3 CPU devices against one, teacher-forced (tests/model/compare_tp.py); skips when
# the checkpoint cannot be fetched. About 10 s on two cores.
add_test(NAME smollm2_tp_cpu
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/model/compare_tp.sh $<TARGET_FILE:metrale-gpu> cpu)
set_tests_properties(smollm2_tp_cpu PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)

# Small random checkpoints of every architecture read (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE)
# in every form (Hugging Face BF16/F32, GGUF Q8_0/F16 with llama.cpp's Q/K permutation where it
# applies, MLX 4/8-bit, NVFP4 in the ModelOpt and compressed-tensors conventions), written at
# test time with transformers' configuration classes, the gguf package, mlx-lm and the script's
# own NVFP4 quantizer, against mlx-lm's float32 logits of each (the NVFP4 forms': of the exactly
# dequantized weights) (tests/model/random_models.py).
# About 20 s on two cores; the sanitizer builds run it too.
add_test(NAME random_models_reference_files
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/model/setup_random.sh
                 ${PROJECT_BINARY_DIR}/random_models_reference)
set_tests_properties(random_models_reference_files PROPERTIES
                     FIXTURES_SETUP random_models_reference TIMEOUT 1500)
add_test(NAME random_models_vs_reference
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/model/compare_random.sh
                 $<TARGET_FILE:metrale-gpu> ${PROJECT_BINARY_DIR}/random_models_reference cpu)
set_tests_properties(random_models_vs_reference PROPERTIES
                     FIXTURES_REQUIRED random_models_reference SKIP_RETURN_CODE 77 TIMEOUT 600)

# The GGUF reader and loader on the committed tiny checkpoints (tests/test_gguf.c).
foreach(t test_gguf test_model_ledger)
  if(TARGET ${t})
    target_compile_definitions(${t} PRIVATE
      METRALE_GGUF_CORPUS="${PROJECT_SOURCE_DIR}/tests/fuzz/corpus_gguf")
  endif()
endforeach()
# The K-quant decoders against gguf.quants' references (tests/model/make_kquant_reference.py).
if(TARGET test_gguf_blocks)
  target_compile_definitions(test_gguf_blocks PRIVATE
    METRALE_KQUANT_DIR="${PROJECT_SOURCE_DIR}/tests/model/kquants")
endif()

# libFuzzer on the GGUF reader, its tokenizer description and chat template (the safetensors
# fuzzer's conditions: cmake/mlx_tests.cmake), from the committed corpus tests/fuzz/corpus_gguf/.
if(TARGET fuzz_safetensors_build)
  file(GLOB gguf_fuzz_sources ${PROJECT_SOURCE_DIR}/src/model/tokenizer*.c ${PROJECT_SOURCE_DIR}/src/model/json.c)
  list(APPEND gguf_fuzz_sources ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_gguf.c
       ${PROJECT_SOURCE_DIR}/src/model/gguf.c ${PROJECT_SOURCE_DIR}/src/model/text_gguf.c
       ${PROJECT_SOURCE_DIR}/src/model/chat.c ${PROJECT_SOURCE_DIR}/src/core/error.c)
  add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/fuzz_gguf
    COMMAND ${METRALE_CLANG} -std=c11 -g -O1 -D_GNU_SOURCE -Wall -Wextra -Werror
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
            -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src/model -I${PROJECT_SOURCE_DIR}/src/core ${gguf_fuzz_sources}
            -o ${PROJECT_BINARY_DIR}/fuzz_gguf
    DEPENDS ${gguf_fuzz_sources}
    COMMENT "Building the GGUF fuzzer with clang" VERBATIM)
  add_custom_target(fuzz_gguf_build ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_gguf)
  add_test(NAME fuzz_gguf_smoke
    COMMAND sh -c "mkdir -p fuzz_corpus_gguf && exec ./fuzz_gguf -max_total_time=${METRALE_FUZZ_SECONDS} -seed=1 -max_len=65536 -timeout=10 fuzz_corpus_gguf ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus_gguf"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(fuzz_gguf_smoke PROPERTIES TIMEOUT 120)
endif()

# libFuzzer on the Hugging Face config.json reader (the same conditions), from the committed
# corpus tests/fuzz/corpus_hf_config/ (configs written by transformers' classes and mlx-lm).
if(TARGET fuzz_safetensors_build)
  set(hf_config_fuzz_sources ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_hf_config.c
      ${PROJECT_SOURCE_DIR}/src/model/model_hf_config.c ${PROJECT_SOURCE_DIR}/src/model/json.c
      ${PROJECT_SOURCE_DIR}/src/core/error.c)
  add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/fuzz_hf_config
    COMMAND ${METRALE_CLANG} -std=c11 -g -O1 -D_GNU_SOURCE -Wall -Wextra -Werror
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
            -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src/model -I${PROJECT_SOURCE_DIR}/src/core
            ${hf_config_fuzz_sources} -lm -o ${PROJECT_BINARY_DIR}/fuzz_hf_config
    DEPENDS ${hf_config_fuzz_sources}
    COMMENT "Building the config.json fuzzer with clang" VERBATIM)
  add_custom_target(fuzz_hf_config_build ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_hf_config)
  add_test(NAME fuzz_hf_config_smoke
    COMMAND sh -c "mkdir -p fuzz_corpus_hf_config && exec ./fuzz_hf_config -max_total_time=${METRALE_FUZZ_SECONDS} -seed=1 -max_len=8192 -timeout=10 fuzz_corpus_hf_config ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus_hf_config"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(fuzz_hf_config_smoke PROPERTIES TIMEOUT 120)
endif()

# The long-run test's claim (memory flat over 10 x 1000 sampled decode steps) is the normal
# build's; instrumented builds run it shorter (3 x 200 steps: the same code paths, the leak and
# bounds checks of ASan/UBSan), since ASan makes each step tens of times slower on two cores.
if(METRALE_SANITIZE OR METRALE_COVERAGE)
  set_tests_properties(test_generate_long PROPERTIES
                       ENVIRONMENT "METRALE_LONG_RUNS=3;METRALE_LONG_STEPS=200")
  # The same for the ledger test's 1000-step runs (its 100-step cases: 20 steps).
  set_tests_properties(test_model_ledger PROPERTIES
                       ENVIRONMENT "METRALE_LEDGER_LONG_STEPS=150;METRALE_LEDGER_SHORT_STEPS=20")
endif()
