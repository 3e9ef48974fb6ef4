// The Linux backends of the Hardware protocols (issue #3).
