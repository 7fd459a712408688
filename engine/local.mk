# The engine (issue 9): the only place that knows cache, model and backend.
libpensieve_la_SOURCES += engine/engine.c engine/engine_sched.c engine/engine_swap.c engine/engine_text.c engine/engine_loop.c \
	engine/engine_profile.c engine/engine_state.c engine/engine_state_dir.c
noinst_HEADERS += engine/engine_internal.h
pkginclude_HEADERS += include/pensieve/engine.h include/pensieve/state.h
