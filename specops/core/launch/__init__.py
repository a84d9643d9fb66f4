"""Launching Triton kernels: each kernel's build options and compiled resources, and the launch
model that picks a plan from them."""
