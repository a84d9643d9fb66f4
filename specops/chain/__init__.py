"""Chain speculative sampling with token verification: public function (``api``), registered op
(``op``), plain reference (``reference``), CPU backend (``cpu``), Triton kernel (``kernel``) and its
launcher (``launch``)."""
