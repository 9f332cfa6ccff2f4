# Sourced by the set-up scripts. find_python LOW HIGH prints the first of $PYTHON, python3,
# python3.13 .. python3.10 on PATH whose version is 3.LOW to 3.HIGH. Returns 1 when there is
# none, 2 when $PYTHON is set and is not such a python (the caller says so, in its words).
find_python() {
    local low=$1 high=$2 candidate
    for candidate in ${PYTHON:-} python3 python3.13 python3.12 python3.11 python3.10; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c "import sys; sys.exit(0 if (3, $low) <= sys.version_info[:2] <= (3, $high) else 1)" \
                2>/dev/null; then
            echo "$candidate"
            return 0
        fi
        if [ -n "${PYTHON:-}" ] && [ "$candidate" = "$PYTHON" ]; then
            return 2
        fi
    done
    return 1
}
