"""Commands that read any run: `tcli evaluate`, `tcli plot`, `tcli count-params`."""
