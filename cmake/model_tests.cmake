# The real model (SmolLM2-135M-Instruct, GGUF) against an independent implementation: the
# fixture converts the file with the gguf package and runs mlx-lm's Llama on it (tests/model/);
# the test runs `metrale-gpu run --model` teacher-forced on the CPU backend and compares every
# step's logits. Sanitizer builds run one case (the loader and the pass under ASan/UBSan), the
# normal build all four.
if(METRALE_SANITIZE)
  set(smollm2_cases 1)
else()
  set(smollm2_cases 0)
endif()
add_test(NAME smollm2_reference_files
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/model/setup.sh ${PROJECT_BINARY_DIR}/smollm2_reference)
set_tests_properties(smollm2_reference_files PROPERTIES FIXTURES_SETUP smollm2_reference TIMEOUT 1500)
add_test(NAME smollm2_vs_mlx_lm
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/model/compare.sh $<TARGET_FILE:metrale-gpu>
                 ${PROJECT_BINARY_DIR}/smollm2_reference cpu ${smollm2_cases})
set_tests_properties(smollm2_vs_mlx_lm PROPERTIES FIXTURES_REQUIRED smollm2_reference
                     SKIP_RETURN_CODE 77 TIMEOUT 1200)
