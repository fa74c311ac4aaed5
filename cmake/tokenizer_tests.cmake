# The tokenizer against the Hugging Face `tokenizers` package (included by CMakeLists.txt after
# the tests are defined): the fixture installs the pinned tokenizers and gguf wheels into
# .venv-text/ (once), fetches SmolLM2's GGUF and writes reference tokenizers and ids
# (tests/tokenizer/setup.sh); test_tokenizer reads them, or skips (77) saying why they could
# not be made.
add_test(NAME tokenizer_reference_files
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/tokenizer/setup.sh ${PROJECT_BINARY_DIR}/tokenizer_reference)
set_tests_properties(tokenizer_reference_files PROPERTIES FIXTURES_SETUP tokenizer_reference TIMEOUT 900)
set_tests_properties(test_tokenizer PROPERTIES FIXTURES_REQUIRED tokenizer_reference
  ENVIRONMENT "METRALE_TOKENIZER_REFERENCE=${PROJECT_BINARY_DIR}/tokenizer_reference")

# The chat templates against jinja2 (tests/test_chat.c): the same virtual environment, with
# the pinned jinja2, renders the real template strings (tests/tokenizer/chat_templates/ and
# SmolLM2's GGUF) into chat_reference/; test_chat skips (77) saying why when it could not.
add_test(NAME chat_reference_files
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/tokenizer/setup.sh ${PROJECT_BINARY_DIR}/chat_reference chat)
set_tests_properties(chat_reference_files PROPERTIES FIXTURES_SETUP chat_reference TIMEOUT 900)
set_tests_properties(test_chat PROPERTIES FIXTURES_REQUIRED chat_reference
  ENVIRONMENT "METRALE_CHAT_REFERENCE=${PROJECT_BINARY_DIR}/chat_reference")
target_compile_definitions(test_chat PRIVATE
  METRALE_CHAT_TEMPLATES="${PROJECT_SOURCE_DIR}/tests/tokenizer/chat_templates")

# libFuzzer on the tokenizer.json reader and the encode/decode paths behind it, built like the
# safetensors fuzzer (cmake/mlx_tests.cmake: clang with libFuzzer, not in the sanitizer and
# coverage builds) from the tokenizer's own sources; a short run from the committed corpus
# (tests/fuzz/corpus_tokenizer/) is a test. New inputs go to the build folder.
if(TARGET fuzz_safetensors_build)
  file(GLOB tok_fuzz_sources ${PROJECT_SOURCE_DIR}/src/model/tokenizer*.c ${PROJECT_SOURCE_DIR}/src/model/json.c)
  list(APPEND tok_fuzz_sources ${PROJECT_SOURCE_DIR}/tests/fuzz/fuzz_tokenizer_json.c)
  add_custom_command(OUTPUT ${PROJECT_BINARY_DIR}/fuzz_tokenizer_json
    COMMAND ${METRALE_CLANG} -std=c11 -g -O1 -D_GNU_SOURCE -Wall -Wextra -Werror
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
            -I${PROJECT_SOURCE_DIR}/include -I${PROJECT_SOURCE_DIR}/src/model ${tok_fuzz_sources}
            -o ${PROJECT_BINARY_DIR}/fuzz_tokenizer_json
    DEPENDS ${tok_fuzz_sources} COMMENT "Building the tokenizer.json fuzzer with clang" VERBATIM)
  add_custom_target(fuzz_tokenizer_json_build ALL DEPENDS ${PROJECT_BINARY_DIR}/fuzz_tokenizer_json)
  add_test(NAME fuzz_tokenizer_json_smoke
    COMMAND sh -c "mkdir -p fuzz_corpus_tokenizer && exec ./fuzz_tokenizer_json -max_total_time=${METRALE_FUZZ_SECONDS} -seed=1 -max_len=4096 -timeout=10 fuzz_corpus_tokenizer ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus_tokenizer"
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR})
  set_tests_properties(fuzz_tokenizer_json_smoke PROPERTIES TIMEOUT 120)
endif()
