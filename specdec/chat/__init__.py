"""Prompt formats: chat templates, tool calls (prompt, grammar, parsing streamed replies) and
fill-in-the-middle prompts."""
