# Sourced by setup_python_data.sh and setup_python_serve.sh: makes $VENV a venv of $PY holding
# exactly the packages of the caller's PINS array, plus those of NO_DEPS_PINS (when set),
# installed without their dependencies. A stamp file of the pins makes a second run a no-op.
# The caller defines VENV, PY, PINS and a log function.
ensure_pinned_venv() {
  local no_deps=() stamp="$VENV/.setup-pins" want
  [[ -v NO_DEPS_PINS ]] && no_deps=("${NO_DEPS_PINS[@]}")
  want="$(printf '%s\n' "${PINS[@]}" "${no_deps[@]}")"
  if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    log "$(basename "$VENV") is up to date"
    return
  fi
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV with $("$PY" --version 2>&1)"
    "$PY" -m venv "$VENV"
  fi
  log "pip installing into $VENV: ${PINS[*]} ${no_deps[*]}"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --no-input -q "${PINS[@]}"
  if ((${#no_deps[@]})); then
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --no-input -q --no-deps "${no_deps[@]}"
  fi
  printf '%s\n' "$want" >"$stamp"
}
