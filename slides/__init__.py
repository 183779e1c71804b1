"""The lab slides: deck sources (*.md) and their offline build (python -m slides.build)."""
