"""TaskStateGuard."""
