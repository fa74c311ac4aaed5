# The Python binding (python/metrale_gpu, ctypes) tested with pytest against this build's
# libmetrale_gpu.so and libmetrale_model.so: the fixture makes the pinned .venv-python/
# (tests/python/setup.sh), the test runs tests/python/ on the CPU backend (tests needing CUDA
# and PyTorch skip themselves).
# Sanitizer builds leave it out: their library needs the sanitizer runtime loaded first, which
# a stock python3 does not do.
if(NOT METRALE_SANITIZE)
  add_test(NAME python_env_files
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/python/setup.sh ${PROJECT_BINARY_DIR}/python_env)
  set_tests_properties(python_env_files PROPERTIES FIXTURES_SETUP python_env TIMEOUT 900)
  add_test(NAME python_binding
           COMMAND bash ${PROJECT_SOURCE_DIR}/tests/python/run.sh $<TARGET_FILE:metrale_gpu>
                   ${PROJECT_BINARY_DIR}/python_env)
  # The model tests (test_model.py) also read the real-model fixture's reference: SmolLM2 with
  # the `tokenizers` package's ids and mlx-lm's logits (cmake/model_tests.cmake).
  set_tests_properties(python_binding PROPERTIES
                       FIXTURES_REQUIRED "python_env;smollm2_reference"
                       ENVIRONMENT "METRALE_SMOLLM2_REFERENCE=${PROJECT_BINARY_DIR}/smollm2_reference"
                       SKIP_RETURN_CODE 77 TIMEOUT 900)
endif()
