"""Operations: logs, metrics and telemetry, health, process tuning, the settings table."""
