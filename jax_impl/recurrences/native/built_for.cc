// The jaxlib whose XLA FFI headers this library was compiled against (CMakeLists.txt defines it): XLA refuses a
// handler built against another FFI API version, so the loader compares it with the jaxlib it runs in.
extern "C" const char* lstm_twins_jaxlib() { return LSTM_TWINS_JAXLIB; }
