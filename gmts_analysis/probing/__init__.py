"""One answer's quantities (kernel), the probe's tables, option validation and the pre-flight checks."""
