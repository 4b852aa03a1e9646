"""Cache eviction and admission policies: interfaces, registry by name, contract kit and cache simulator."""
