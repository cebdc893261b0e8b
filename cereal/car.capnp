@0x8e2af1e708af8b8d;   # openpilot's car.capnp file id (see log.capnp for what this subset keeps and why)

struct CarState {
  errorsDEPRECATED @0 :AnyPointer;
  vEgo @1 :Float32;
  wheelSpeeds @2 :AnyPointer;
  gas @3 :Float32;
  gasPressed @4 :Bool;
  brake @5 :Float32;
  brakePressed @6 :Bool;
  steeringAngleDeg @7 :Float32;
  steeringTorque @8 :Float32;       # driver torque on the wheel, > 0 turns left (the lane-change nudge)
  steeringPressed @9 :Bool;
  cruiseState @10 :CruiseState;
  buttonEvents @11 :AnyPointer;
  canMonoTimesDEPRECATED @12 :List(UInt64);
  eventsDEPRECATED @13 :AnyPointer;
  gearShifter @14 :GearShifter;
  steeringRateDeg @15 :Float32;
  aEgo @16 :Float32;
  vEgoRaw @17 :Float32;
  standstill @18 :Bool;
  brakeLightsDEPRECATED @19 :Bool;
  leftBlinker @20 :Bool;
  rightBlinker @21 :Bool;
  yawRate @22 :Float32;
  genericToggle @23 :Bool;
  doorOpen @24 :Bool;
  seatbeltUnlatched @25 :Bool;
  canValid @26 :Bool;
  steeringTorqueEps @27 :Float32;
  clutchPressed @28 :Bool;
  steeringRateLimitedDEPRECATED @29 :Bool;
  stockAeb @30 :Bool;
  stockFcw @31 :Bool;
  espDisabled @32 :Bool;
  leftBlindspot @33 :Bool;
  rightBlindspot @34 :Bool;

  struct CruiseState {
    enabled @0 :Bool;
    speed @1 :Float32;
    available @2 :Bool;
    speedOffset @3 :Float32;
    standstill @4 :Bool;
    nonAdaptive @5 :Bool;
    speedCluster @6 :Float32;
  }

  enum GearShifter {
    unknown @0; park @1; drive @2; neutral @3; reverse @4; sport @5; low @6; brake @7; eco @8; manumatic @9;
  }
}

struct CarControl {
  enabled @0 :Bool;
  gasDEPRECATED @1 :Float32;
  brakeDEPRECATED @2 :Float32;
  steeringTorqueDEPRECATED @3 :Float32;
  cruiseControl @4 :AnyPointer;
  hudControl @5 :AnyPointer;
  actuators @6 :AnyPointer;
  activeDEPRECATED @7 :Bool;
  rollDEPRECATED @8 :Float32;
  pitchDEPRECATED @9 :Float32;
  actuatorsOutputDEPRECATED @10 :AnyPointer;
  latActive @11 :Bool;              # lateral control engaged (lane changes need it)
}
