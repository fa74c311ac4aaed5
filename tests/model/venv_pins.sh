# venv_pins.sh - sourced by tests/model/setup*.sh: the one list of pinned wheels of .venv-model/,
# shared by every fixture that uses it (a fixture asking for a different list would rebuild the
# environment under another's feet). transformers is a dependency of mlx-lm, pinned here
# because random_models.py writes its configurations with transformers' own classes.
MLX_VERSION=0.32.4
MODEL_VENV_PINS=("mlx==$MLX_VERSION" "mlx-cpu==$MLX_VERSION" "mlx-lm==0.32.2" "gguf==0.19.0"
                 "transformers==5.24.0")
