# Sourced by the CI set-up steps. apt_install installs Debian packages that are missing,
# only where that can work (root and apt-get present); `apt-get update` runs once per CI run.
apt_install() {
    local missing=()
    for pkg in "$@"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "not root or no apt-get: cannot install ${missing[*]}"
        return 1
    fi
    if [ ! -e /tmp/.course-ci-apt-updated ]; then
        apt-get update -qq && touch /tmp/.course-ci-apt-updated
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
