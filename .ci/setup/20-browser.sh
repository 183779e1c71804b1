#!/usr/bin/env bash
# Headless Chromium and node for the slide decks and the JupyterLab browser test (Playwright for
# Python drives this Chromium; it downloads no browser): `make slides` copies reveal.js from its npm
# package and prints each deck to PDF with Chromium, and tests/test_slides.py opens the decks and
# the course index in it. pdfinfo (poppler-utils) counts the PDF's pages.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
apt_install chromium poppler-utils fonts-dejavu-core
