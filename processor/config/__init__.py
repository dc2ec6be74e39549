"""Configuration: the settings object and the secrets derived from it."""
