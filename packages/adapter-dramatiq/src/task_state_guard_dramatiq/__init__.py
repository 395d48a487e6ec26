"""Adapter."""
