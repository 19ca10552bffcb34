"""Model zoo shared by tests/ and benchmarks/ (not part of the tflms
package)."""
