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
