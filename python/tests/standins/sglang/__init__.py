"""Stand-in of the sglang package for kvpool's tests: only the modules the
HiCache L3 storage interface touches, written from ENGINES.md section 1
(no SGLang code). Parent packages are empty so nothing heavy is imported."""
